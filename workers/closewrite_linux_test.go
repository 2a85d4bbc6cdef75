//go:build linux

package workers

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// segmentsIn is how many TCP segments c has received (tcpi_segs_in).
func segmentsIn(tb testing.TB, c *net.TCPConn) uint32 {
	tb.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	var info *unix.TCPInfo
	var gerr error
	raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if gerr != nil {
		tb.Fatal(gerr)
	}
	return info.Segs_in
}

// TestCloseSendsLastResponseWithFIN: the response after which a
// connection closes reaches the client in the same segment as the FIN
// (writeBeforeClose). The client counts the segments it received after
// its request (tcpi_segs_in, the handshake's SYN-ACK taken before): one
// for the response with the FIN, and at most one ACK of the request
// before it; write then close sent the FIN in a segment of its own, one
// more (3).
func TestCloseSendsLastResponseWithFIN(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(be.Close)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 1)
	a := addr(t, m, "web")

	exchange := func(req string) uint32 {
		c := dialTCP(t, a)
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		before := segmentsIn(t, c)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c) // to the FIN
		if err != nil || !strings.HasSuffix(string(got), "\r\n\r\nok") {
			t.Fatalf("response %q, %v", got, err)
		}
		return segmentsIn(t, c) - before
	}
	for range 5 {
		closing := exchange("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
		if closing > 2 {
			t.Fatalf("a response followed by the close came in %d segments after the request, want the response and the FIN in one (and at most an ACK before)", closing)
		}
	}
}
