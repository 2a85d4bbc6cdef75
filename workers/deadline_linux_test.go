package workers

import (
	"bufio"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHeadInTheSocketArmsNoHeaderTimeout: a request head that is in the
// socket when it is read arms no header timeout (a clock read and a timer
// per connection in the connection-per-request mode, before): the one
// read deadline move of a new connection's single request is the idle
// wait's, after the response (TCP_DEFER_ACCEPT on the listening socket makes
// sure the head is in before the connection is accepted). A head that has to be waited for still
// is cut by header_timeout (TestSlowlorisCutByHeaderTimeout,
// TestSlowlorisOnKeepAliveCutByHeaderTimeout).
func TestHeadInTheSocketArmsNoHeaderTimeout(t *testing.T) {
	if !httpfront.RawIO {
		t.Skip("no raw socket I/O on this platform: every head read arms header_timeout")
	}
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be), 1)
	// So that the head is in the socket when the proxy first reads, the
	// kernel holds each connection back from accept until its first
	// bytes are in.
	for _, ml := range m.listeners {
		for _, s := range ml.sockets {
			rc, err := s.ln.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 5) }); err != nil || serr != nil {
				t.Fatalf("TCP_DEFER_ACCEPT on the listening socket: %v %v", err, serr)
			}
		}
	}
	for i := range 5 {
		c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		keepAliveRequests(t, c, bufio.NewReader(c), 1)
		cc := onlyClientConn(t, m)
		settledAfterClose(t, m, c, cc)
		set := &m.workers[0].conns
		set.mu.Lock()
		moves, _ := cc.DeadlineMoves()
		set.mu.Unlock()
		if moves != 1 {
			t.Fatalf("connection %d: the read deadline moved %d times for one request whose head was in the socket, want 1 (the idle wait's)", i, moves)
		}
	}
}
