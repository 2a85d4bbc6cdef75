package workers

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

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

// keepAliveClient is one raw keep-alive client connection.
type keepAliveClient struct {
	c  net.Conn
	br *bufio.Reader
}

func dialKeepAliveClients(tb testing.TB, a string, n int) []keepAliveClient {
	tb.Helper()
	cs := make([]keepAliveClient, n)
	for i := range cs {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			tb.Fatalf("connection %d of %d: %v", i+1, n, err)
		}
		tb.Cleanup(func() { c.Close() })
		cs[i] = keepAliveClient{c, bufio.NewReader(c)}
	}
	return cs
}

// exchange sends one request and reads its whole response.
func (k keepAliveClient) exchange(path string) error {
	k.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || resp.Close || string(b) != "ok" {
		return errors.New("unexpected response " + resp.Status + " " + string(b))
	}
	return nil
}

// waitClosedByProxy reads until the proxy closes the connection; it fails
// on any byte or on no close within d.
func (k keepAliveClient) waitClosedByProxy(d time.Duration) error {
	k.c.SetReadDeadline(time.Now().Add(d))
	n, err := io.Copy(io.Discard, k.br)
	if err != nil {
		return err
	}
	if n != 0 {
		return errors.New("bytes before the close")
	}
	return nil
}

// Many idle keep-alive connections park without a goroutine each, then all
// send a request at the same moment: every one is answered, twice over
// (a woken connection parks again), and the connection set knew them all
// along.
func TestIdleConnsParkedThenAllAnswered(t *testing.T) {
	n := 400
	if lim, err := nofileLimit(); err == nil && lim < uint64(3*n+256) {
		n = int(lim-256) / 3
	}
	m := startManager(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 2)
	a := addr(t, m, "web")
	runtime.GC()
	before := runtime.NumGoroutine()
	cs := dialKeepAliveClients(t, a, n)
	for round := range 3 {
		if round == 0 {
			for i, k := range cs {
				if err := k.exchange("/first"); err != nil {
					t.Fatalf("connection %d, first request: %v", i, err)
				}
			}
		} else {
			// All at once: every request is sent before any response
			// is read.
			var wg sync.WaitGroup
			errs := make(chan error, n)
			start := make(chan struct{})
			for _, k := range cs {
				wg.Go(func() {
					<-start
					errs <- k.exchange("/again")
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			failed := 0
			var first error
			for err := range errs {
				if err != nil {
					failed++
					first = cmpErr(first, err)
				}
			}
			if failed > 0 {
				t.Fatalf("round %d: %d of %d requests failed, first: %v", round, failed, n, first)
			}
		}
		waitFor(t, 10*time.Second, "every connection to park", func() bool { return parkedConns(m) == n })
		if got := m.workers[0].conns.len() + m.workers[1].conns.len(); got != n {
			t.Fatalf("round %d: the connection sets hold %d connections, want %d", round, got, n)
		}
		// Parked connections hold no goroutine: what runs beyond the
		// test's own is the pollers, and the resumers that wait
		// (at most httpfront.MaxIdleResumers per worker).
		// The goroutines the serve pool keeps between connections
		// (servepool.go) are let go first, as the reclaimer would within
		// reclaimPoll: they are no connection's.
		limit := 2*httpfront.MaxIdleResumers + 16
		grown := 0
		settled := func() bool {
			retireServePools(m)
			grown = runtime.NumGoroutine() - before
			return grown <= limit
		}
		for deadline := time.Now().Add(5 * time.Second); !settled() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if grown > limit {
			t.Fatalf("round %d: %d goroutines more than before for %d idle connections, want at most %d (parked connections hold none)", round, grown, n, limit)
		}
	}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// A parked connection is closed at its idle timeout (no goroutine reads
// its deadline: the idle timer does), not before, and the connection ends
// as any does: its slot and its place in the set are given back.
func TestParkedIdleTimeout(t *testing.T) {
	const idle = 400 * time.Millisecond
	lst := parkingListener()
	lst.IdleTimeout = dur(idle)
	m := startManager(t, &config.Config{Listeners: []config.Listener{lst}}, 1)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 20)
	// A busy connection keeps its timer armed across requests: the
	// timer must re-arm, not close it, while it keeps sending.
	busy := cs[0]
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	start := time.Now()
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m) == len(cs) })
	for time.Since(start) < 2*idle {
		if err := busy.exchange("/busy"); err != nil {
			t.Fatalf("a connection that kept sending every few ms was cut after %v: %v", time.Since(start), err)
		}
		time.Sleep(idle / 20) // the client's pace, not a wait for the proxy
	}
	for i, k := range cs[1:] {
		if err := k.waitClosedByProxy(10 * time.Second); err != nil {
			t.Fatalf("idle connection %d: %v, want a clean close at the idle timeout", i+1, err)
		}
	}
	if waited := time.Since(start); waited < idle {
		t.Fatalf("idle connections closed after %v, before their %v idle timeout", waited, idle)
	}
	if err := busy.waitClosedByProxy(10 * time.Second); err != nil {
		t.Fatalf("the busy connection once idle: %v", err)
	}
	waitFor(t, 5*time.Second, "the connection set to empty", func() bool { return m.workers[0].conns.len() == 0 })
	// Close leaves the set first; the slot goes back when the
	// connection's goroutine has ended it.
	waitFor(t, 5*time.Second, "every idle-poller slot to be given back", func() bool {
		slots, free, _ := m.workers[0].front.IdlePollerSlots()
		return slots > 0 && free == slots
	})
}

// A drain closes parked connections once idle for its grace, and Close
// ends every parked connection's goroutine-less wait: none is left, and
// no goroutine either.
func TestDrainClosesParked(t *testing.T) {
	runtime.GC()
	before := runtime.NumGoroutine()
	m := startManager(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 2)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 50)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m) == len(cs) })
	start := time.Now()
	if err := m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for i, k := range cs {
		if err := k.waitClosedByProxy(10 * time.Second); err != nil {
			t.Fatalf("parked connection %d after the drain: %v", i, err)
		}
	}
	if waited := time.Since(start); waited < drainIdleGrace {
		t.Fatalf("parked connections closed after %v, before the %v grace", waited, drainIdleGrace)
	}
	// A second set, parked again, is ended by Close without a drain.
	m2 := startManager(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 1)
	cs2 := dialKeepAliveClients(t, addr(t, m2, "web"), 30)
	for i, k := range cs2 {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m2) == len(cs2) })
	if err := m2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, k := range cs2 {
		if err := k.waitClosedByProxy(10 * time.Second); err != nil {
			t.Fatalf("parked connection %d after Close: %v", i, err)
		}
	}
	m.Close()
	waitFor(t, 10*time.Second, "the pollers' and resumers' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// The point of parking: an idle keep-alive connection holds no
// goroutine, so it costs no goroutine stack. Judged by the goroutines
// alive once every connection is parked (clients here too, their
// goroutines are not started: raw conns): StackInuse alone cannot tell,
// since the stacks the accept path's goroutines freed stay in the
// runtime's stack pool (a test run alone saw 2-3 KiB "per connection"
// of them; in the suite the pool was grown already).
func TestParkedIdleConnHasNoStack(t *testing.T) {
	const n = 300
	m := startManager(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 1)
	before := heapAfterGC()
	goroutinesBefore := runtime.NumGoroutine()
	cs := dialKeepAliveClients(t, addr(t, m, "web"), n)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	// Parked, not only idle: an idle connection whose goroutine has not
	// yet handed its socket to the poller still holds its stack.
	waitFor(t, 5*time.Second, "every connection to park", func() bool { return parkedConns(m) == n })
	// The serve pool's goroutines (servepool.go, bounded per worker) are
	// no connection's: let go, as the reclaimer would within reclaimPoll.
	waitFor(t, 5*time.Second, "the serve pool to empty", func() bool { return retireServePools(m) == 0 })
	// A goroutine may still be on its way out of a connection it parked.
	// What may stay is per worker, not per connection: the poller and
	// up to httpfront.MaxIdleResumers resumers waiting for a wake.
	bound := httpfront.MaxIdleResumers + 8
	extra := 0
	waitFor(t, 5*time.Second, fmt.Sprintf("at most %d more goroutines than before %d parked connections", bound, n), func() bool {
		extra = runtime.NumGoroutine() - goroutinesBefore
		return extra <= bound
	})
	after := heapAfterGC()
	stack := (float64(after.StackInuse) - float64(before.StackInuse)) / n
	heap := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
	t.Logf("%d idle plaintext keep-alive connections parked: %d more goroutines; %.2f KiB of stack (pooled stacks included), %.2f KiB of heap per connection (both sides of the socket)",
		n, extra, stack/1024, heap/1024)
}

func nofileLimit() (uint64, error) {
	var lim syscall.Rlimit
	err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur, err
}

// BenchmarkH1ProxyKeepAliveParked is BenchmarkH1ProxyKeepAlive with
// park_idle_connections: the A/B of what a park per idle transition
// costs (epoll_ctl, the poller's epoll_wait, a hand-over to a resumer).
// 0 allocs/op too.
func BenchmarkH1ProxyKeepAliveParked(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, func(l *config.Listener) { l.ParkIdleConnections = true }), 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// parkingListener is an http listener "web" with park_idle_connections,
// answering "ok" itself.
func parkingListener() config.Listener {
	l := httpListener("web", directRoute("ok"))
	l.ParkIdleConnections = true
	return l
}

// Without park_idle_connections (the default) nothing parks: an idle
// connection waits in its goroutine as before.
func TestIdleConnsDoNotParkByDefault(t *testing.T) {
	m := startManager(t, &config.Config{Listeners: []config.Listener{httpListener("web", directRoute("ok"))}}, 1)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 10)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	waitFor(t, 5*time.Second, "every connection to be idle", func() bool { return idleConns(m) == len(cs) })
	if n := parkedConns(m); n != 0 {
		t.Fatalf("%d connections parked without park_idle_connections", n)
	}
	if _, _, started := m.workers[0].front.IdlePollerSlots(); started {
		t.Fatal("the idle poller was started without park_idle_connections")
	}
}

// Like an attacker: a parked connection woken by half a request head that
// never completes gets the header timeout (its deadline was dropped at the
// park, and set afresh), not a wait without end; one whose client resets
// or half-closes while parked ends, and gives its slot and place back.
func TestParkedConnHostileClients(t *testing.T) {
	const headerTimeout = 300 * time.Millisecond
	lst := parkingListener()
	lst.HeaderTimeout = dur(headerTimeout)
	m := startManager(t, &config.Config{Listeners: []config.Listener{lst}}, 1)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 3)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m) == len(cs) })

	slow, reset, halfClosed := cs[0], cs[1], cs[2]
	start := time.Now()
	if _, err := io.WriteString(slow.c, "GET /never-finished HTTP/1.1\r\nHost: t\r\n"); err != nil {
		t.Fatal(err)
	}
	reset.c.(*net.TCPConn).SetLinger(0)
	reset.c.Close()
	halfClosed.c.(*net.TCPConn).CloseWrite()

	slow.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(slow.br, nil)
	if err != nil {
		t.Fatalf("half a head on a parked connection: %v, want a 408 at the header timeout", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("half a head on a parked connection: %s, want 408", resp.Status)
	}
	if waited := time.Since(start); waited < headerTimeout/2 {
		t.Fatalf("408 after %v, well before the %v header timeout", waited, headerTimeout)
	}
	if err := halfClosed.waitClosedByProxy(10 * time.Second); err != nil {
		t.Fatalf("half-closed while parked: %v, want the proxy to close too", err)
	}
	waitFor(t, 5*time.Second, "the connection set to empty", func() bool { return m.workers[0].conns.len() == 0 })
	waitFor(t, 5*time.Second, "every idle-poller slot to be given back", func() bool {
		slots, free, _ := m.workers[0].front.IdlePollerSlots()
		return free == slots
	})
}

// retireServePools lets go the goroutines parked in each worker's serve
// pool, and returns how many were still parked.
func retireServePools(m *Manager) int {
	n := 0
	for _, wk := range m.workers {
		n += wk.pool.retire()
	}
	return n
}
