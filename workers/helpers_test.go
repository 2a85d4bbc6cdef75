package workers

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/stats"
)

// testLogger logs at debug into nothing: the debug paths run, quietly.
func testLogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: io.Discard})
}

func dur(d time.Duration) config.Duration { return config.Duration(d) }

func boolp(b bool) *bool { return &b }

// httpListener is an http listener on a loopback port chosen by the kernel.
func httpListener(name string, routes ...config.Route) config.Listener {
	return config.Listener{Name: name, Address: "127.0.0.1:0", Protocol: config.ProtocolHTTP, Routes: routes}
}

func tcpListener(name, cluster string) config.Listener {
	return config.Listener{Name: name, Address: "127.0.0.1:0", Protocol: config.ProtocolTCP, Cluster: cluster}
}

func cluster(name string, endpoints ...string) config.Cluster {
	return config.Cluster{Name: name, Endpoints: endpoints, ConnectTimeout: dur(2 * time.Second)}
}

func toCluster(prefix, cluster string) config.Route {
	return config.Route{Prefix: prefix, Cluster: cluster}
}

// startManager builds, binds and starts cfg with n workers; Close at cleanup.
func startManager(tb testing.TB, cfg *config.Config, n int) *Manager {
	tb.Helper()
	return startManagerParkingAfter(tb, cfg, n, 0)
}

// startManagerParkingAfter is startManager with the park grace
// (parksweep.go) made parkAfter where a listener parks idle connections
// (0: httpfront.ParkIdleAfter), so that a test of a park need not wait
// for the real one.
func startManagerParkingAfter(tb testing.TB, cfg *config.Config, n int, parkAfter time.Duration) *Manager {
	tb.Helper()
	// As config.Load leaves it: the workers take every value as given.
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, n)
	if err != nil {
		tb.Fatalf("BuildSnapshotN: %v", err)
	}
	m, err := New(Options{Concurrency: n, Logger: testLogger()}, snap)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { m.Close() })
	if parkAfter > 0 && m.parkIdleAfter > 0 {
		m.parkIdleAfter = parkAfter
	}
	m.Start()
	return m
}

// addr is the host:port a listener really listens on.
func addr(tb testing.TB, m *Manager, listener string) string {
	tb.Helper()
	a := m.Addr(listener)
	if a == nil {
		tb.Fatalf("no listener %q", listener)
	}
	return a.String()
}

// hostOf is the host:port of a URL like "http://127.0.0.1:1234".
func hostOf(url string) string { return strings.TrimPrefix(url, "http://") }

// newClient is a keep-alive client whose idle connections close at cleanup.
func newClient(tb testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func get(tb testing.TB, c *http.Client, url string, hdr ...string) (*http.Response, string) {
	tb.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: body: %v", url, err)
	}
	return resp, string(b)
}

// rawRequest writes raw on a fresh connection to addr and returns the
// response read back.
func rawRequest(tb testing.TB, addr, raw string) *http.Response {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		tb.Fatalf("reading response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// rawBackend serves every accepted connection with fn until cleanup.
func rawBackend(tb testing.TB, fn func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fn(c)
			}()
		}
	}()
	tb.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// deadPort is a loopback address nothing listens on.
func deadPort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// waitFor polls cond every few milliseconds for at most d.
func waitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(delay)
	}
}

func ctxTimeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// counter is this generation's value of the counter name in m's store.
func counter(m *Manager, name string) uint64 { return m.Stats().Counter(name).Value() }

// gauge is this generation's value of the gauge name (a sum-mode gauge).
func gauge(m *Manager, name string) int64 { return m.Stats().Gauge(name, stats.GaugeSum).Value() }

// lstat is the counter listener.<first listener>.<stat> of m.
func lstat(m *Manager, stat string) uint64 {
	return counter(m, "listener."+m.listeners[0].name+"."+stat)
}

// cxActive is listener.<first listener>.downstream_cx_active of m.
func cxActive(m *Manager) int64 { return gauge(m, "listener."+m.listeners[0].name+"."+statCxActive) }

// parkedConns counts the connections parked in their worker's idle
// poller (no goroutine).
func parkedConns(m *Manager) int {
	n := 0
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			if cc, ok := c.(*httpfront.Conn); ok && cc.Parked() {
				n++
			}
		}
		wk.conns.mu.Unlock()
	}
	return n
}
