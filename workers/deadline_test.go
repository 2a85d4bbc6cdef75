package workers

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// onlyClientConn returns the one HTTP connection of the manager's first
// worker.
func onlyClientConn(t *testing.T, m *Manager) *clientConn {
	t.Helper()
	set := &m.workers[0].conns
	var cc *clientConn
	waitFor(t, 5*time.Second, "the connection in its worker's set", func() bool {
		set.mu.Lock()
		defer set.mu.Unlock()
		for k := range set.m {
			cc, _ = k.(*clientConn)
		}
		return cc != nil
	})
	return cc
}

// settledAfterClose closes c and waits for cc's goroutine to end (it
// removes cc from the set), after which cc's counters are settled.
func settledAfterClose(t *testing.T, m *Manager, c net.Conn, cc *clientConn) {
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
	if !rawIO {
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
	moves := cc.writeDeadlineMoves
	set.mu.Unlock()
	if moves != 0 {
		t.Fatalf("the write deadline moved %d times for 50 small keep-alive responses, want 0 (armed only when a write waits)", moves)
	}
}
