package workers

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// onlyClientConn returns the one HTTP connection of the manager's first
// worker.
func onlyClientConn(t *testing.T, m *Manager) *httpfront.Conn {
	t.Helper()
	set := &m.workers[0].conns
	var cc *httpfront.Conn
	waitFor(t, 5*time.Second, "the connection in its worker's set", func() bool {
		set.mu.Lock()
		defer set.mu.Unlock()
		for k := range set.m {
			cc, _ = k.(*httpfront.Conn)
		}
		return cc != nil
	})
	return cc
}

// settledAfterClose closes c and waits for cc's goroutine to end (it
// removes cc from the set), after which cc's counters are settled.
func settledAfterClose(t *testing.T, m *Manager, c net.Conn, cc *httpfront.Conn) {
	t.Helper()
	c.Close()
	set := &m.workers[0].conns
	waitFor(t, 5*time.Second, "the connection to end", func() bool {
		set.mu.Lock()
		defer set.mu.Unlock()
		_, open := set.m[cc]
		return !open
	})
}

// keepAliveRequests sends n requests one after the other on c, reading
// each response whole.
func keepAliveRequests(t *testing.T, c net.Conn, br *bufio.Reader, n int) {
	t.Helper()
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
}

// TestKeepAliveArmsNoWriteDeadline: responses that the socket takes at
// once never arm the write deadline (a timer and a clock read per
// response, before).
func TestKeepAliveArmsNoWriteDeadline(t *testing.T) {
	if !httpfront.RawIO {
		t.Skip("no raw socket I/O on this platform: every write arms its deadline")
	}
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	keepAliveRequests(t, c, bufio.NewReader(c), 50)
	cc := onlyClientConn(t, m)
	settledAfterClose(t, m, c, cc)
	set := &m.workers[0].conns
	set.mu.Lock()
	_, moves := cc.DeadlineMoves()
	set.mu.Unlock()
	if moves != 0 {
		t.Fatalf("the write deadline moved %d times for 50 small keep-alive responses, want 0 (armed only when a write waits)", moves)
	}
}

// A write that had to wait arms the write deadline; once the client has
// read the response and stayed idle past write_timeout, the deadline left
// behind must not fail the next response, which the socket takes at
// once. And a client that stops reading is still cut by write_timeout.
func TestWriteDeadlineAfterABlockedWrite(t *testing.T) {
	big := strings.Repeat("z", 8<<20)
	be := rawKeepAliveBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n"+big)
	const writeTimeout = 300 * time.Millisecond
	m := startManager(t, proxyConfig(be, func(l *config.Listener) { l.WriteTimeout = dur(writeTimeout) }), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A fixed receive buffer: autotuned (tcp_rmem's maximum is 32 MiB
	// on some machines) it took a whole 8 MiB response, so the proxy's
	// writes never waited and the client that stopped reading was idle
	// to it, not slow (6 runs in 20 under -race).
	if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	keepAliveRequests(t, c, br, 1) // 8 MiB: the proxy's writes wait for us
	cc := onlyClientConn(t, m)
	time.Sleep(2 * writeTimeout) // idle past the deadline the writes armed
	keepAliveRequests(t, c, br, 1)

	// Now stop reading: the proxy must give up on us.
	io.WriteString(c, "GET /ka HTTP/1.1\r\nHost: ka.example\r\n\r\n")
	start := time.Now()
	set := &m.workers[0].conns
	waitFor(t, 10*time.Second, "the slow reader cut", func() bool { return set.len() == 0 })
	// A deadline moves only when it is more than its slack behind
	// (httpfront.DeadlineSlackFor): it may fire that much early, never later.
	if d, early := time.Since(start), httpfront.DeadlineSlackFor(writeTimeout); d < writeTimeout-early {
		t.Fatalf("the slow reader was cut after %v, before write_timeout %v less its slack %v", d, writeTimeout, early)
	}
	set.mu.Lock()
	_, moves := cc.DeadlineMoves()
	set.mu.Unlock()
	if moves == 0 {
		t.Fatal("8 MiB responses to a client reading slowly never armed the write deadline")
	}
}
