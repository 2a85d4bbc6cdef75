package workers

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

func TestDrainHTTP(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "done "+r.URL.Path)
	}))
	t.Cleanup(be.Close)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 2)
	a := addr(t, m, "web")
	c := newClient(t)
	if resp, body := get(t, c, "http://"+a+"/fast"); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before drain: %d %q close=%v", resp.StatusCode, body, resp.Close)
	}

	type result struct {
		resp *http.Response
		body string
		err  error
	}
	slow := make(chan result, 1)
	go func() {
		resp, err := c.Get("http://" + a + "/slow")
		if err != nil {
			slow <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- result{resp, string(b), err}
	}()
	<-arrived

	drained := make(chan error, 2)
	start := time.Now()
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}) }()
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}) }() // concurrent, idempotent

	waitFor(t, 5*time.Second, "new connections to be refused", func() bool {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
			return false
		}
		return true
	})
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	r := <-slow
	if r.err != nil || r.resp.StatusCode != 200 || r.body != "done /slow" {
		t.Fatalf("in-flight request: %+v", r)
	}
	if !r.resp.Close { // set by net/http from "Connection: close"
		t.Fatalf("response during drain lacks Connection: close (headers %v)", r.resp.Header)
	}
	for range 2 {
		if err := <-drained; err != nil {
			t.Fatalf("Drain: %v", err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Drain took %v", d)
	}
	if err := m.Drain(context.Background(), DrainOptions{}); err != nil {
		t.Fatalf("Drain again: %v", err)
	}
}

func TestDrainTCP(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	m := startManager(t, tcpConfig(be, 0), 1)
	a := addr(t, m, "tcp")

	// One session ends by itself during the drain, one outlives it.
	ends, stays := dialTCP(t, a), dialTCP(t, a)
	for _, c := range []*net.TCPConn{ends, stays} {
		c.Write([]byte("ping"))
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctx, DrainOptions{}) }()
	ends.Close()
	waitFor(t, 5*time.Second, "one session left", func() bool { return cxActive(m) == 1 })
	// The survivor still works during the drain.
	stays.Write([]byte("pong"))
	if _, err := io.ReadFull(stays, make([]byte, 4)); err != nil {
		t.Fatalf("session cut during drain: %v", err)
	}
	cancel()
	if err := <-drained; err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("forced Drain: %v", err)
	}
	if _, err := io.ReadAll(stays); err != nil && !isReset(err) {
		t.Fatalf("survivor not closed at the deadline: %v", err)
	}
}

// TestDrainUpgraded: an upgraded (hijacked) connection is invisible to
// http.Server's Shutdown; the drain waits for it and closes it at the end.
func TestDrainUpgraded(t *testing.T) {
	m := startManager(t, proxyConfig(upgradeBackend(t)), 1)
	c, br := dialUpgrade(t, addr(t, m, "web"))
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctx, DrainOptions{}) }()
	waitFor(t, 5*time.Second, "accepting to stop", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.stopped
	})
	if err := echoLine(t, c, br, "still here\n"); err != nil {
		t.Fatalf("upgraded connection cut by the drain: %v", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with an upgraded connection open", err)
	default:
	}
	cancel()
	if err := <-drained; err == nil {
		t.Fatal("forced Drain returned nil")
	}
	if err := echoLine(t, c, br, "gone?\n"); err == nil {
		t.Fatal("upgraded connection still open after the drain deadline")
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// TestNoGoroutineLeak: after Close, every goroutine the Manager started
// (accept loops, connections, upgrades, timers) is gone.
func TestNoGoroutineLeak(t *testing.T) {
	be := echoBackend(t)
	tcpBe := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	c := newClient(t)
	runtime.GC()
	before := runtime.NumGoroutine()

	cfg := proxyConfig(hostOf(be.URL))
	tcfg := tcpConfig(tcpBe, 0)
	cfg.Listeners = append(cfg.Listeners, tcfg.Listeners...)
	cfg.Clusters = append(cfg.Clusters, cluster("backend2", tcpBe))
	cfg.Listeners[1].Cluster = "backend2"
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Concurrency: 2}, snap)
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	for range 10 {
		if resp, _ := get(t, c, "http://"+addr(t, m, "web")+"/x"); resp.StatusCode != 200 {
			t.Fatal(resp.StatusCode)
		}
	}
	open := dialTCP(t, addr(t, m, "tcp")) // left open: Close must end it
	open.Write([]byte("x"))
	io.ReadFull(open, make([]byte, 1))
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	open.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestDrainKeepAlive: during a drain, a keep-alive client that keeps
// sending is never handed a closed connection — its next response says
// "Connection: close" — while a connection left idle is closed cleanly once
// idle for drainIdleGrace, so the drain ends without waiting for its
// deadline.
func TestDrainKeepAlive(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 1)
	a := addr(t, m, "web")

	dialKeepAlive := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(15 * time.Second))
		return c, bufio.NewReader(c)
	}
	exchange := func(c net.Conn, br *bufio.Reader) *http.Response {
		t.Helper()
		if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
			t.Fatalf("writing a request: %v", err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	busy, busyR := dialKeepAlive()
	idle, idleR := dialKeepAlive()
	for _, r := range []*http.Response{exchange(busy, busyR), exchange(idle, idleR)} {
		if r.StatusCode != 200 || r.Close {
			t.Fatalf("before the drain: %s close=%v", r.Status, r.Close)
		}
	}

	start := time.Now()
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}) }()
	waitFor(t, 5*time.Second, "the drain to begin", func() bool { return m.draining.Load() })

	if r := exchange(busy, busyR); r.StatusCode != 200 || !r.Close {
		t.Fatalf("busy client during the drain: %s close=%v, want 200 with Connection: close", r.Status, r.Close)
	}
	if n, err := io.Copy(io.Discard, busyR); n != 0 || err != nil {
		t.Fatalf("busy connection after its last response: %d bytes, %v; want a clean close", n, err)
	}
	if n, err := io.Copy(io.Discard, idleR); n != 0 || err != nil {
		t.Fatalf("idle connection: %d bytes, %v; want a clean close", n, err)
	}
	if waited := time.Since(start); waited < drainIdleGrace {
		t.Fatalf("idle connection closed after %v, before the %v grace", waited, drainIdleGrace)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
}
