package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// killableBackend is an HTTP backend on a fixed loopback address that a
// test can kill (listener and connections closed at once) and revive on
// the same address. It answers every path with its id, and with status
// (200 by default).
type killableBackend struct {
	t    testing.TB
	id   string
	Addr string

	mu     sync.Mutex // guards srv and status
	srv    *http.Server
	status int

	count countingInt // requests answered, across revivals
}

type countingInt struct {
	mu sync.Mutex
	n  int64
}

func (c *countingInt) add()         { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *countingInt) get() int64   { c.mu.Lock(); defer c.mu.Unlock(); return c.n }
func (c *countingInt) reset() int64 { c.mu.Lock(); defer c.mu.Unlock(); n := c.n; c.n = 0; return n }

func startKillable(t testing.TB, id string) *killableBackend {
	t.Helper()
	b := &killableBackend{t: t, id: id, status: http.StatusOK}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.Addr = ln.Addr().String()
	b.serve(ln)
	t.Cleanup(b.kill)
	return b
}

func (b *killableBackend) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		b.count.add()
		b.mu.Lock()
		st := b.status
		b.mu.Unlock()
		w.WriteHeader(st)
		fmt.Fprintf(w, "%s\n", b.id)
	}), ReadHeaderTimeout: 10 * time.Second}
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
	go srv.Serve(ln)
}

func (b *killableBackend) setStatus(code int) {
	b.mu.Lock()
	b.status = code
	b.mu.Unlock()
}

// kill closes the listener and every connection: connects are refused.
func (b *killableBackend) kill() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// revive listens again on the same address.
func (b *killableBackend) revive() {
	b.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port was ours a moment ago; bounded retries
		if ln, err = net.Listen("tcp4", b.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		b.t.Fatalf("revive %s on %s: %v", b.id, b.Addr, err)
	}
	b.serve(ln)
}

// clustersDump is GET /clusters?format=json.
type clustersDump struct {
	Clusters []struct {
		Name      string `json:"name"`
		Panic     bool   `json:"panic"`
		Endpoints []struct {
			Address       string `json:"address"`
			HealthCheck   string `json:"health_check"`
			Ejected       bool   `json:"ejected"`
			Ejections     int    `json:"ejections"`
			RqTotal       uint64 `json:"rq_total"`
			Rq5xx         uint64 `json:"rq_5xx"`
			CxConnectFail uint64 `json:"cx_connect_fail"`
		} `json:"endpoints"`
		Breakers *struct {
			Requests    int64 `json:"requests"`
			MaxRequests int64 `json:"max_requests"`
		} `json:"circuit_breakers"`
	} `json:"clusters"`
}

type adminGetter interface {
	AdminDo(method, path string) (*http.Response, []byte, error)
}

func getClusters(t testing.TB, p adminGetter) clustersDump {
	t.Helper()
	resp, body, err := p.AdminDo(http.MethodGet, "/clusters?format=json")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /clusters?format=json: %v %v %s", err, resp, body)
	}
	var d clustersDump
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("/clusters?format=json: %v\n%s", err, body)
	}
	return d
}

// endpointState returns the health check and ejection of addr in cluster
// "backend".
func endpointState(t testing.TB, p adminGetter, addr string) (check string, ejected bool, ejections int) {
	t.Helper()
	for _, c := range getClusters(t, p).Clusters {
		if c.Name != "backend" {
			continue
		}
		for _, e := range c.Endpoints {
			if e.Address == addr {
				return e.HealthCheck, e.Ejected, e.Ejections
			}
		}
	}
	t.Fatalf("/clusters has no endpoint %s in cluster backend", addr)
	return "", false, 0
}

// waitEndpoint polls /clusters until cond holds for addr, and returns how
// long that took.
func waitEndpoint(t testing.TB, p adminGetter, addr string, within time.Duration, what string, cond func(check string, ejected bool) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		check, ej, _ := endpointState(t, p, addr)
		if cond(check, ej) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v (health_check %s, ejected %v)", what, within, check, ej)
		}
		time.Sleep(pollEvery)
	}
}

// TestHealthCheckKilledBackendUnderLoad: a backend killed under load is
// marked unhealthy within interval × unhealthy_threshold (plus a round's
// timeout); from then on clients see no failure and no connect goes to
// it; once it listens again it is taken back.
func TestHealthCheckKilledBackendUnderLoad(t *testing.T) {
	t.Parallel()
	const interval, threshold = 100 * time.Millisecond, 2
	stay := harness.StartHTTPBackend(t, "stay")
	victim := startKillable(t, "victim")
	cfg := httpProxyConfig(stay.Addr, victim.Addr)
	cfg.Extra = fmt.Sprintf("[clusters.health_check]\npath = \"/\"\ninterval = %q\ntimeout = \"200ms\"\nunhealthy_threshold = %d\nhealthy_threshold = 2\n", interval, threshold)
	p := harness.Start(t, cfg)

	if check, _, _ := endpointState(t, p, victim.Addr); check != "healthy" {
		t.Fatalf("victim health_check %q at start, want healthy", check)
	}
	load := startSteadyLoad(t, loadgen.Options{URL: p.URL("web", "/"), Mode: loadgen.KeepAlive, Clients: 4, Requests: 300, Timeout: 5 * time.Second})
	load.WaitMore(t, 200)
	if victim.count.get() == 0 {
		t.Fatal("the victim took no requests before it was killed: the test proves nothing")
	}

	victim.kill()
	took := waitEndpoint(t, p, victim.Addr, 5*time.Second, "victim marked unhealthy", func(c string, _ bool) bool { return c == "unhealthy" })
	// One round may be in flight when it dies (up to interval + jitter
	// + timeout), then threshold rounds.
	if bound := interval*threshold*11/10 + 2*interval + 200*time.Millisecond; took > bound {
		t.Errorf("marked unhealthy after %v, want within %v", took, bound)
	}
	before := load.Snapshot()
	failBefore := getStats(t, p)["cluster.backend.upstream_cx_connect_fail"]
	load.WaitMore(t, 1000)
	after := load.Snapshot()
	if d := after.Failed() - before.Failed(); d != 0 {
		t.Fatalf("%d failed requests after the victim was marked unhealthy: %v", d, after)
	}
	if d := getStats(t, p)["cluster.backend.upstream_cx_connect_fail"] - failBefore; d != 0 {
		t.Errorf("%d connects to the unhealthy endpoint", d)
	}

	victim.count.reset()
	victim.revive()
	waitEndpoint(t, p, victim.Addr, 5*time.Second, "victim taken back", func(c string, _ bool) bool { return c == "healthy" })
	load.WaitMore(t, 500)
	res := load.Stop()
	if victim.count.get() == 0 {
		t.Error("the revived backend takes no requests")
	}
	t.Logf("load: %v; unhealthy after %v", res, took)
	v := getStats(t, p)
	if v["cluster.backend.health_check.failure"] < threshold || v["cluster.backend.health_check.success"] == 0 {
		t.Errorf("health_check counters: failure %d, success %d", v["cluster.backend.health_check.failure"], v["cluster.backend.health_check.success"])
	}
	if got := v["cluster.backend.membership_healthy"]; got != 2 {
		t.Errorf("membership_healthy %d, want 2", got)
	}
}

// TestOutlierEjection5xx: a backend that answers 500 is ejected after
// consecutive_5xx of them, returns after base_ejection_time, and is
// ejected for longer the second time; with both backends failing, only
// max_ejection_percent of them is ejected.
func TestOutlierEjection5xx(t *testing.T) {
	t.Parallel()
	good := startKillable(t, "good")
	bad := startKillable(t, "bad")
	bad.setStatus(500)
	cfg := httpProxyConfig(bad.Addr, good.Addr)
	cfg.Extra = "[clusters.outlier_detection]\nconsecutive_5xx = 3\nbase_ejection_time = \"1s\"\nmax_ejection_percent = 50\n"
	p := harness.Start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}

	fives := 0
	for i := 0; i < 100; i++ {
		resp, _ := get(t, client, p.URL("web", "/"))
		if resp.StatusCode == 500 {
			fives++
		}
		if _, ej, _ := endpointState(t, p, bad.Addr); ej {
			break
		}
	}
	// The proxy has two workers; each 5xx is counted wherever it came
	// from, so the third ejects (the monitor acts a moment later: one
	// more may slip through).
	if fives < 3 || fives > 4 {
		t.Errorf("%d 5xx before the ejection, want 3 (or 4)", fives)
	}
	ejectedAt := time.Now()
	for range 30 {
		if resp, body := get(t, client, p.URL("web", "/")); resp.StatusCode != 200 || body != "good\n" {
			t.Fatalf("while bad is ejected: %d %q", resp.StatusCode, body)
		}
	}
	back := waitEndpoint(t, p, bad.Addr, 5*time.Second, "bad returns", func(_ string, ej bool) bool { return !ej })
	if since := time.Since(ejectedAt) + back; since < 900*time.Millisecond {
		t.Errorf("returned after %v, before base_ejection_time", since)
	}
	// Still failing: ejected again, for twice as long.
	for range 20 {
		get(t, client, p.URL("web", "/"))
		if _, ej, _ := endpointState(t, p, bad.Addr); ej {
			break
		}
	}
	if _, ej, n := endpointState(t, p, bad.Addr); !ej || n != 2 {
		t.Fatalf("second ejection: ejected %v, ejections %d", ej, n)
	}
	// Now the good one fails too: 50% are ejected already, so it stays.
	good.setStatus(503)
	for range 30 {
		get(t, client, p.URL("web", "/"))
	}
	v := getStats(t, p)
	if _, ej, _ := endpointState(t, p, good.Addr); ej {
		t.Error("both endpoints ejected with max_ejection_percent = 50")
	}
	if v["cluster.backend.outlier_detection.ejections_overflow"] == 0 {
		t.Error("ejections_overflow not counted")
	}
	if v["cluster.backend.outlier_detection.ejections_enforced_total"] != 2 {
		t.Errorf("ejections_enforced_total %d, want 2", v["cluster.backend.outlier_detection.ejections_enforced_total"])
	}
	// The text form shows it too.
	code, body := p.AdminGet("/clusters")
	if code != 200 || !strings.Contains(string(body), "backend::"+bad.Addr+"::ejected::true") || !strings.Contains(string(body), "backend::"+good.Addr+"::rq_5xx::") {
		t.Errorf("GET /clusters: %d\n%s", code, body)
	}
}

// TestCircuitBreakerOverflow: with max_requests reached by slow requests,
// further requests are answered 503 at once and counted; none waits.
func TestCircuitBreakerOverflow(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b")
	cfg := httpProxyConfig(b.Addr)
	cfg.Extra = "[clusters.circuit_breakers]\nmax_requests = 2\nmax_pending_requests = 2\nmax_connections = 8\n"
	p := harness.Start(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	slowStatus := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL("web", "/slow?ms=1500"), nil)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				slowStatus[i] = resp.StatusCode
			}
		}()
	}
	// Both slow requests are at the backend (readiness, not a sleep).
	waitFor(t, 5*time.Second, "the slow requests to reach the backend", func() bool { return b.Requests() >= 2 })
	client := &http.Client{Timeout: 5 * time.Second}
	var worst time.Duration
	for range 10 {
		start := time.Now()
		resp, body := get(t, client, p.URL("web", "/"))
		worst = max(worst, time.Since(start))
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "overflow") {
			t.Fatalf("request past max_requests: %d %q, want 503 upstream overflow", resp.StatusCode, body)
		}
	}
	if worst > 200*time.Millisecond {
		t.Errorf("an overflowing request took %v; it must be refused at once", worst)
	}
	v := getStats(t, p)
	if got := v["cluster.backend.upstream_rq_pending_overflow"]; got != 10 {
		t.Errorf("upstream_rq_pending_overflow %d, want 10", got)
	}
	wg.Wait()
	if slowStatus[0] != 200 || slowStatus[1] != 200 {
		t.Errorf("the requests within the limit got %v, want 200s", slowStatus)
	}
	// The slots are given back: requests pass again.
	if resp, _ := get(t, client, p.URL("web", "/")); resp.StatusCode != 200 {
		t.Errorf("after the slow requests: %d", resp.StatusCode)
	}
	for _, c := range getClusters(t, p).Clusters {
		if c.Breakers == nil || c.Breakers.Requests != 0 || c.Breakers.MaxRequests != 2 {
			t.Errorf("breakers in /clusters: %+v", c.Breakers)
		}
	}
}

// TestHealthCheckAcrossHotRestart: a new generation checks every endpoint
// once before it reports ready, and routes only to the ones that passed:
// across restarts under load, no request fails and no connect goes to the
// dead endpoint.
func TestHealthCheckAcrossHotRestart(t *testing.T) {
	t.Parallel()
	live := harness.StartHTTPBackend(t, "b1")
	dead := startKillable(t, "dead")
	dead.kill()
	cfg := restartConfig("1s", "2s", "100ms", live.Addr)
	// The dead endpoint comes first: worker 0's round robin starts there.
	cfg.Clusters[0].Endpoints = []string{dead.Addr, live.Addr}
	// A long interval: only the check made at the start of a generation
	// can know the endpoint is dead.
	cfg.Extra = "[clusters.health_check]\ninterval = \"1h\"\ntimeout = \"500ms\"\n\n" + cfg.Extra
	c := startChain(t, cfg)

	load := startSteadyLoad(t, loadgen.Options{
		URL: c.serving.URL("web", "/"), Mode: loadgen.ConnPerRequest, Clients: 4,
		Requests: 200, Timeout: 5 * time.Second, Check: backendCheck("b1"),
	})
	load.WaitMore(t, 100)
	for i := 1; i <= 3; i++ {
		child, parent := c.restart()
		waitExit0(t, parent, exitTimeout)
		if check, _, _ := endpointState(t, child, dead.Addr); check != "unhealthy" {
			t.Fatalf("restart %d: the new generation says the dead endpoint is %q", i, check)
		}
		load.WaitMore(t, 100)
	}
	res := load.Stop()
	t.Log(res)
	if res.Failed() != 0 {
		t.Fatalf("failures across restarts: %v", res)
	}
	var fails uint64
	if n, ok := adminStats(t, c.serving).counter("cluster.backend.upstream_cx_connect_fail"); ok {
		fails = n
	}
	if fails != 0 {
		t.Errorf("%d connects to the endpoint no generation found healthy", fails)
	}
}
