package workers

import (
	"bufio"
	"context"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"io"
	"net"
	"net/http"
	"runtime/metrics"
	"testing"
	"time"
)

// goroutinesCreated is the process's count of goroutines ever created.
func goroutinesCreated(tb testing.TB) uint64 {
	tb.Helper()
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		tb.Fatalf("runtime/metrics has no %s", s[0].Name)
	}
	return s[0].Value.Uint64()
}

// closeRequests sends n requests, each on a new connection that the proxy
// closes after its response (Connection: close), one after the other.
func closeRequests(tb testing.TB, a string, n int) {
	tb.Helper()
	req := []byte("GET /pool HTTP/1.1\r\nHost: pool.example\r\nConnection: close\r\n\r\n")
	buf := make([]byte, 4096)
	for i := range n {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			tb.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(req); err != nil {
			tb.Fatal(err)
		}
		got := 0
		for {
			k, err := c.Read(buf[got:])
			got += k
			if err != nil {
				break
			}
		}
		c.Close()
		if want := len(benchResponse); got < len(benchResponse) {
			tb.Fatalf("request %d: %d bytes of response, want at least %d", i, got, want)
		}
	}
}

// TestServePoolReusesGoroutines: connections one after the other are
// served by goroutines the worker parked, not by a new goroutine each, so
// a new connection does not grow a new stack. Before the pool every
// connection started one.
func TestServePoolReusesGoroutines(t *testing.T) {
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	a := addr(t, m, "web")
	closeRequests(t, a, 10) // the upstream connection, the first goroutines
	const n = 200
	before := goroutinesCreated(t)
	closeRequests(t, a, n)
	created := goroutinesCreated(t) - before
	t.Logf("%d goroutines created for %d connections", created, n)
	if created > n/4 {
		t.Fatalf("%d goroutines created for %d connections one after the other: the worker's parked goroutines were not reused", created, n)
	}
}

// parkOne sends requests until a goroutine of p is parked (the reclaimer
// may retire one before it is seen).
func parkOne(tb testing.TB, a string, p *servePool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		closeRequests(tb, a, 1)
		for wait := time.Now().Add(100 * time.Millisecond); time.Now().Before(wait); time.Sleep(time.Millisecond) {
			if p.parked.Load() > 0 {
				return
			}
		}
	}
	tb.Fatal("no goroutine parked after its connection ended, for 5s")
}

// TestServePoolEmptiesWhenIdle: the goroutines parked by a worker exit
// within a reclaimer poll or two once no connection comes, so an idle
// pool holds no stack.
func TestServePoolEmptiesWhenIdle(t *testing.T) {
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	p := &m.workers[0].pool
	parkOne(t, addr(t, m, "web"), p)
	waitFor(t, 10*reclaimPoll, "the idle pool to empty", func() bool { return p.parked.Load() == 0 })
}

// TestServePoolDrain: a drain waits on connections, not on parked
// goroutines: with goroutines parked and no connection open it ends at
// once, and the parked goroutines exit with it.
func TestServePoolDrain(t *testing.T) {
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	p := &m.workers[0].pool
	parkOne(t, addr(t, m, "web"), p)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Drain(ctx, DrainOptions{HTTPTimeout: 5 * time.Second}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Drain took %v with no connection open: it waited on the parked goroutines", took)
	}
	waitFor(t, 3*time.Second, "the parked goroutines to exit at the drain", func() bool { return p.parked.Load() == 0 })
}

// TestKeepAliveMovesNoDeadlinePerRequest: a keep-alive connection whose
// requests come one after the other moves its read deadline about once,
// not twice per request (the header timeout armed, then the idle one
// again: two timer resets per request before).
func TestKeepAliveMovesNoDeadlinePerRequest(t *testing.T) {
	const n = 50
	cc := serveKeepAliveRequests(t, n)
	moves, _ := cc.DeadlineMoves()
	t.Logf("%d read deadline moves for %d requests", moves, n)
	if moves > 5 {
		t.Fatalf("the read deadline moved %d times for %d keep-alive requests: it is reset per request", moves, n)
	}
}

// TestKeepAliveIdleWaitsWakeOnlyForRequests: each idle wait of a
// keep-alive connection ends with its client's next request in, never
// in a wake that finds nothing (a read that returns EAGAIN, a buffer
// taken and given back). The socket joins the poller at its first idle
// wait (rawsock.Conn.Register): its RawConn retries the callback once
// it registers, which the idle wait, counting its calls, would take for
// a wake.
func TestKeepAliveIdleWaitsWakeOnlyForRequests(t *testing.T) {
	const n = 20
	cc := serveKeepAliveRequests(t, n)
	if got := cc.SpuriousWakes(); got != 0 {
		t.Fatalf("%d of the idle waits between %d keep-alive requests woke with nothing to read", got, n)
	}
}

// serveKeepAliveRequests sends n requests one after the other on one
// keep-alive connection through a fresh proxy, each after the last
// response, then closes it, and returns the proxy's side of it once it
// has ended (its counters settled).
func serveKeepAliveRequests(t *testing.T, n int) *httpfront.Conn {
	t.Helper()
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	for i := range n {
		if _, err := io.WriteString(c, "GET /ka HTTP/1.1\r\nHost: ka.example\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	set := &m.workers[0].conns
	var cc *httpfront.Conn
	set.mu.Lock()
	for k := range set.m {
		cc, _ = k.(*httpfront.Conn)
	}
	set.mu.Unlock()
	if cc == nil {
		t.Fatal("the connection is not in its worker's set")
	}
	c.Close()
	// The connection's goroutine removes it from the set when it ends:
	// once a look under the set's lock finds it gone, its counters are
	// settled (and the lock orders the caller's reads after its writes).
	waitFor(t, 5*time.Second, "the connection to end", func() bool {
		set.mu.Lock()
		defer set.mu.Unlock()
		_, open := set.m[cc]
		return !open
	})
	return cc
}
