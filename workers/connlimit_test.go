package workers

import (
	"bufio"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// okRoute answers every request 200 from the proxy itself.
var okRoute = config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "ok"}}

// refuseWithin bounds how long a refused connection may take to be closed:
// "at once", with room for a loaded CI machine; a connection left in the
// queue would hang past it.
const refuseWithin = 5 * time.Second

// probeHTTP dials addr and sends one keep-alive request. It returns the
// open connection if it was served (200), or nil if the proxy closed it
// without an answer; a connection that neither answers nor closes within
// refuseWithin fails the test.
func probeHTTP(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(refuseWithin))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		return nil // closed (reset) before the request went out
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tb.Fatalf("connection to %s neither served nor closed within %v: left in the queue?", addr, refuseWithin)
	}
	if err != nil {
		return nil
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		tb.Fatalf("status %d, want 200", resp.StatusCode)
	}
	c.SetDeadline(time.Time{})
	return c
}

// probeMany probes addr n times, holding every served connection, and
// returns the served ones and how many were closed.
func probeMany(tb testing.TB, addr string, n int) (served []net.Conn, closed int) {
	tb.Helper()
	for range n {
		if c := probeHTTP(tb, addr); c != nil {
			served = append(served, c)
		} else {
			closed++
		}
	}
	return served, closed
}

// TestMaxConnectionsListener: with max_connections = N, of N+5 clients that
// hold their connections N are served and 5 are closed at once and counted
// in downstream_cx_overflow; once some close, new ones are served again.
// Two workers with a socket each: the bound is the listener's, not each
// worker's.
func TestMaxConnectionsListener(t *testing.T) {
	const n = 4
	l := httpListener("web", okRoute)
	l.MaxConnections = n
	m := startManager(t, &config.Config{Listeners: []config.Listener{l}}, 2)
	a := addr(t, m, "web")

	served, closed := probeMany(t, a, n+5)
	if len(served) != n || closed != 5 {
		t.Fatalf("of %d clients: %d served, %d closed; want %d served, 5 closed", n+5, len(served), closed, n)
	}
	waitFor(t, 5*time.Second, "downstream_cx_overflow = 5", func() bool { return lstat(m, statCxOverflow) == 5 })
	if got := lstat(m, statCxTotal); got != n {
		t.Errorf("downstream_cx_total %d, want %d: refused connections are counted only as overflow", got, n)
	}

	// Two leave: two new ones are served, the next one is refused.
	served[0].Close()
	served[1].Close()
	waitFor(t, 5*time.Second, "two connections to close", func() bool { return cxActive(m) == n-2 })
	if more, closed := probeMany(t, a, 3); len(more) != 2 || closed != 1 {
		t.Fatalf("after two closed: %d served, %d closed; want 2 served, 1 closed", len(more), closed)
	}
	waitFor(t, 5*time.Second, "downstream_cx_overflow = 6", func() bool { return lstat(m, statCxOverflow) == 6 })
}

// TestMaxConnectionsTCP: the bound holds for TCP-proxy sessions, and a
// session's end gives its slot back.
func TestMaxConnectionsTCP(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	cfg := tcpConfig(be, 0)
	cfg.Listeners[0].MaxConnections = 2
	m := startManager(t, cfg, 2)
	a := addr(t, m, "tcp")

	echoes := func(c *net.TCPConn) bool {
		c.SetDeadline(time.Now().Add(refuseWithin))
		if _, err := io.WriteString(c, "ping"); err != nil {
			return false
		}
		b := make([]byte, 4)
		_, err := io.ReadFull(c, b)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("TCP connection neither echoed nor closed within %v", refuseWithin)
		}
		return err == nil && string(b) == "ping"
	}
	// Which of the three is refused is the accept order, not the dial
	// order: two workers accept, and either may take a later one first.
	conns := []*net.TCPConn{dialTCP(t, a), dialTCP(t, a), dialTCP(t, a)}
	var served []*net.TCPConn
	got := make([]bool, len(conns))
	for i, c := range conns {
		if got[i] = echoes(c); got[i] {
			served = append(served, c)
		}
	}
	if len(served) != 2 {
		t.Fatalf("echoed %v, want two served and one closed", got)
	}
	waitFor(t, 5*time.Second, "downstream_cx_overflow = 1", func() bool { return lstat(m, statCxOverflow) == 1 })

	served[0].Close()
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 1 })
	if c4 := dialTCP(t, a); !echoes(c4) {
		t.Fatal("a new session after one ended was not served: its slot was not given back")
	}
}

// TestMaxConnectionsServer: server.max_connections bounds all listeners
// together; the refusal counts on the listener that refused.
func TestMaxConnectionsServer(t *testing.T) {
	cfg := &config.Config{
		Server:    config.Server{MaxConnections: 3},
		Listeners: []config.Listener{httpListener("a", okRoute), httpListener("b", okRoute)},
	}
	m := startManager(t, cfg, 2)
	aa, ba := addr(t, m, "a"), addr(t, m, "b")

	servedA, _ := probeMany(t, aa, 2)
	servedB, _ := probeMany(t, ba, 1)
	if len(servedA) != 2 || len(servedB) != 1 {
		t.Fatalf("under the bound: a served %d of 2, b %d of 1", len(servedA), len(servedB))
	}
	if c := probeHTTP(t, ba); c != nil {
		t.Fatal("b: a 4th connection of the server was served; want it closed (server.max_connections = 3)")
	}
	if c := probeHTTP(t, aa); c != nil {
		t.Fatal("a: a 4th connection of the server was served; want it closed")
	}
	waitFor(t, 5*time.Second, "one overflow on each listener", func() bool {
		return counter(m, "listener.a."+statCxOverflow) == 1 && counter(m, "listener.b."+statCxOverflow) == 1
	})
	servedA[0].Close()
	waitFor(t, 5*time.Second, "a's connection to close", func() bool { return gauge(m, "listener.a."+statCxActive) == 1 })
	if c := probeHTTP(t, ba); c == nil {
		t.Fatal("b: not served after a connection of a closed")
	}
}

// TestMaxConnectionsDerived: server.max_connections = 0 bounds the
// connections by the open-file limit.
func TestMaxConnectionsDerived(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int64
	}{
		{64, 16},       // below the reserve: a quarter
		{128, 32},      // (128 - 64) / 2
		{1024, 461},    // (1024 - 102) / 2
		{65536, 29491}, // (65536 - 6553) / 2
		{1 << 20, 471859},
		{math.MaxUint64, int64((1<<40 - (1<<40)/10) / 2)}, // unlimited: capped, not overflowed
	} {
		if got := derivedMaxConnections(tc.limit); got != tc.want {
			t.Errorf("open-file limit %d: %d connections, want %d", tc.limit, got, tc.want)
		}
	}
	m := startManager(t, &config.Config{Listeners: []config.Listener{httpListener("web", okRoute)}}, 1)
	limit, err := openFileLimit()
	if err != nil {
		t.Skipf("no open-file limit here: %v", err)
	}
	if got, want := m.budget.max, derivedMaxConnections(limit); got != want {
		t.Errorf("server-wide bound %d, want %d for the open-file limit %d", got, want, limit)
	}
}

// TestShedOne: out of descriptors, the spare one lets the accept loop take
// a queued connection and close it; the spare is back afterwards, and an
// empty queue sheds nothing (the loop then backs off).
func TestShedOne(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b := newConnBudget(0, testLogger())
	defer b.close()
	if b.spare.Load() == nil {
		t.Fatal("no spare descriptor")
	}
	c := dialTCP(t, ln.Addr().String()) // queued: the handshake is done
	if !b.shedOne(ln) {
		t.Fatal("shedOne did not take the queued connection")
	}
	c.SetReadDeadline(time.Now().Add(refuseWithin))
	n, err := c.Read(make([]byte, 1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the shed connection was not closed")
	}
	if n != 0 || err == nil {
		t.Fatalf("read %d bytes (%v) from a shed connection, want EOF or a reset", n, err)
	}
	if b.spare.Load() == nil {
		t.Fatal("the spare descriptor was not re-opened")
	}
	if b.shedOne(ln) {
		t.Fatal("shedOne reported a connection from an empty queue")
	}
	if b.spare.Load() == nil {
		t.Fatal("the spare descriptor was not re-opened after an empty queue")
	}
}

// BenchmarkConnSlots is the per-connection cost of the bounds: a slot taken
// on accept and given back on close, on every core at once, with a
// listener bound and the server-wide bound over three listeners.
func BenchmarkConnSlots(b *testing.B) {
	budget := newConnBudget(1<<30, testLogger())
	defer budget.close()
	budget.join(new(paddedCount)) // two more listeners' counts to sum
	budget.join(new(paddedCount))
	s := newConnSlots(budget, nil, &listenerSnap{name: "web", maxConnections: 1 << 30}, testLogger())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if s.take() != admitted {
				b.Fatal("refused under the bound")
			}
			s.release()
		}
	})
}
