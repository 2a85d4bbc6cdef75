package workers

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

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
	// A park grace well inside the idle timeout, so that the
	// connections park before it.
	m := startManagerParkingAfter(t, &config.Config{Listeners: []config.Listener{lst}}, 1, idle/8)
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
	if n := lstat(m, httpfront.StatIdleParked); n < uint64(len(cs)) {
		t.Fatalf("%s = %d, want at least %d (each connection parked)", httpfront.StatIdleParked, n, len(cs))
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

// A connection that parks after the grace keeps its idle timeout from
// its last response, not from its park: with a grace of 40 % of the
// idle timeout, one that counted from the park would close at least that
// much late.
func TestParkedIdleTimeoutCountsFromLastResponse(t *testing.T) {
	const idle = time.Second
	const grace = 400 * time.Millisecond
	lst := parkingListener()
	lst.IdleTimeout = dur(idle)
	m := startManagerParkingAfter(t, &config.Config{Listeners: []config.Listener{lst}}, 1, grace)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 5)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	last := time.Now()
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m) == len(cs) })
	for i, k := range cs {
		if err := k.waitClosedByProxy(10 * time.Second); err != nil {
			t.Fatalf("parked connection %d: %v, want a close at the idle timeout", i, err)
		}
	}
	waited := time.Since(last)
	if early := idle - httpfront.DeadlineSlackFor(idle); waited < early {
		t.Fatalf("closed %v after the last response, before the %v idle timeout", waited, idle)
	}
	if waited >= idle+grace {
		t.Fatalf("closed %v after the last response: the %v idle timeout counted from the park, not from the last response", waited, idle)
	}
}

// Close meets connections in every state of a park at once (a grace of
// a millisecond, so the sweep asks them while Close runs: waiting in
// their goroutine, asked, being armed, parked): each ends, its client
// sees the close, and Close returns (it waits for every connection's
// goroutine), five times over.
func TestCloseWhileParking(t *testing.T) {
	for round := range 5 {
		m := startManagerParkingAfter(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 2, time.Millisecond)
		cs := dialKeepAliveClients(t, addr(t, m, "web"), 40)
		for i, k := range cs {
			if err := k.exchange("/x"); err != nil {
				t.Fatalf("round %d, connection %d: %v", round, i, err)
			}
		}
		// Some parked, some not yet: the sweep runs every millisecond.
		time.Sleep(time.Duration(round) * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- m.Close() }()
		for i, k := range cs {
			if err := k.waitClosedByProxy(10 * time.Second); err != nil {
				t.Fatalf("round %d, connection %d after Close: %v", round, i, err)
			}
		}
		select {
		case err := <-closed:
			if err != nil {
				t.Fatalf("round %d: Close: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Close did not return within 10s (a connection's goroutine never ended)", round)
		}
	}
}

// A drain closes parked connections once idle for its grace, and Close
// ends every parked connection's goroutine-less wait: none is left, and
// no goroutine either.
func TestDrainClosesParked(t *testing.T) {
	runtime.GC()
	before := runtime.NumGoroutine()
	m := startManagerParkingAfter(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 2, 20*time.Millisecond)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 50)
	for i, k := range cs {
		if err := k.exchange("/x"); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	// Idle from here: the drain's grace counts from the connections'
	// last response, not from their park.
	start := time.Now()
	waitFor(t, 5*time.Second, "the connections to park", func() bool { return parkedConns(m) == len(cs) })
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}) }()
	// A parked connection whose client sends during the drain, before
	// its grace is over, is answered with "Connection: close", and
	// closed after it.
	waitFor(t, 5*time.Second, "the drain to begin", m.draining.Load)
	woken := cs[0]
	woken.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(woken.c, "GET /during-drain HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(woken.br, nil)
	if err != nil {
		t.Fatalf("a parked connection woken during the drain: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("a parked connection woken during the drain: %s, Connection: close %v; want 200 with Connection: close", resp.Status, resp.Close)
	}
	if err := <-drained; err != nil {
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
// park_idle_connections set. Its ping-pong client sends each request
// within the park grace, so its connection never parks: what parking
// by default costs a busy keep-alive connection (an atomic store and a
// compare-and-swap per idle wait). 0 allocs/op too.
func BenchmarkH1ProxyKeepAliveParked(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, func(l *config.Listener) { l.ParkIdleConnections = new(true) }), 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// parkingListener is an http listener "web" with park_idle_connections,
// answering "ok" itself.
func parkingListener() config.Listener {
	l := httpListener("web", directRoute("ok"))
	l.ParkIdleConnections = new(true)
	return l
}

// By default (park_idle_connections left out, a listener without TLS)
// idle connections park, but only once idle for the park grace: clients
// that keep sending never park (not one park counted while they do),
// and once they stop, every connection parks (its goroutine is gone),
// then serves its next request and parks again.
func TestIdleConnsParkByDefaultAfterGrace(t *testing.T) {
	const n = 8
	m := startManager(t, &config.Config{Listeners: []config.Listener{httpListener("web", directRoute("ok"))}}, 1)
	if m.parkIdleAfter != httpfront.ParkIdleAfter {
		t.Fatalf("park grace %v, want the default %v", m.parkIdleAfter, httpfront.ParkIdleAfter)
	}
	cs := dialKeepAliveClients(t, addr(t, m, "web"), n)
	// Keep-alive load: each client sends its next request as soon as
	// it has its response, for a few park graces and sweeps.
	busyFor := 4 * httpfront.ParkIdleAfter
	var wg sync.WaitGroup
	errs := make(chan error, n)
	requests := make([]int, n)
	for i, k := range cs {
		wg.Go(func() {
			for start := time.Now(); time.Since(start) < busyFor; requests[i]++ {
				if err := k.exchange("/busy"); err != nil {
					errs <- fmt.Errorf("connection %d, request %d: %w", i, requests[i]+1, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if parks := lstat(m, httpfront.StatIdleParked); parks != 0 {
		t.Fatalf("%s = %d after %v of back-to-back keep-alive requests (%v per connection), want 0: a connection parked within the %v grace",
			httpfront.StatIdleParked, parks, busyFor, requests, httpfront.ParkIdleAfter)
	}
	if _, _, started := m.workers[0].front.IdlePollerSlots(); started {
		t.Fatal("the idle poller was started by busy keep-alive connections")
	}
	// Idle now: each parks within a grace and a sweep, and holds no
	// goroutine (Parked: no goroutine runs it).
	for round := 1; round <= 2; round++ {
		waitFor(t, 5*time.Second, fmt.Sprintf("round %d: every idle connection to park", round), func() bool { return parkedConns(m) == n })
		if parks := lstat(m, httpfront.StatIdleParked); parks != uint64(round*n) {
			t.Fatalf("round %d: %s = %d, want %d (one park per idle connection)", round, httpfront.StatIdleParked, parks, round*n)
		}
		for i, k := range cs {
			if err := k.exchange("/after-park"); err != nil {
				t.Fatalf("round %d: parked connection %d: %v", round, i, err)
			}
		}
	}
}

// Like an attacker: requests sent just as the park sweep asks their
// connection to park (a grace of a millisecond, a client pausing for
// about that long, 200 times, alone, pipelined in pairs, or as a head
// split around the pause) are each answered exactly once: none lost to
// the deadline the sweep moves, none answered twice, no hang.
func TestParkRaceWithRequests(t *testing.T) {
	const tries = 200
	const grace = time.Millisecond
	m := startManagerParkingAfter(t, &config.Config{Listeners: []config.Listener{parkingListener()}}, 1, grace)
	cs := dialKeepAliveClients(t, addr(t, m, "web"), 2)
	req := "GET /race HTTP/1.1\r\nHost: t\r\n\r\n"
	sent := 0
	for i := range tries {
		k := cs[i%len(cs)]
		// The client's pace around the grace, not a wait for the proxy.
		time.Sleep(time.Duration(i%5) * grace / 2)
		k.c.SetDeadline(time.Now().Add(10 * time.Second))
		want := 1
		var err error
		switch i % 3 {
		case 0:
			_, err = io.WriteString(k.c, req)
		case 1:
			_, err = io.WriteString(k.c, req+req)
			want = 2
		case 2:
			if _, err = io.WriteString(k.c, req[:10]); err == nil {
				time.Sleep(grace)
				_, err = io.WriteString(k.c, req[10:])
			}
		}
		if err != nil {
			t.Fatalf("try %d: send: %v", i, err)
		}
		sent += want
		for j := range want {
			resp, err := http.ReadResponse(k.br, nil)
			if err != nil {
				t.Fatalf("try %d, response %d of %d: %v (after %d parks)", i, j+1, want, err, lstat(m, httpfront.StatIdleParked))
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || string(b) != "ok" {
				t.Fatalf("try %d, response %d of %d: %s %q %v", i, j+1, want, resp.Status, b, err)
			}
		}
	}
	// Nothing more comes: no response twice.
	for i, k := range cs {
		k.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := k.br.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d after the last response: %d bytes, %v; want nothing more", i, n, err)
		}
	}
	if got := lstat(m, statRqTotal); got != uint64(sent) {
		t.Fatalf("%s = %d, want %d requests", statRqTotal, got, sent)
	}
	// The race was run: connections did park between requests.
	if parks := lstat(m, httpfront.StatIdleParked); parks == 0 {
		t.Fatalf("%s = 0: no connection parked in %d tries, the boundary was not reached", httpfront.StatIdleParked, tries)
	} else {
		t.Logf("%d requests, %d parks", sent, parks)
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
