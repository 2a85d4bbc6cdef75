package workers

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// closingAfterFirstBackend answers the first request on each connection
// (with 100 Continue first when it asks for it) and keeps the connection;
// a second request on it finds the connection closed, its head read and
// unanswered: the close an upstream makes of an idle connection, met as
// the proxy reuses it. bodies receives each body answered.
func closingAfterFirstBackend(tb testing.TB, stale *atomic.Int64, bodies chan<- string) string {
	tb.Helper()
	return rawBackend(tb, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.Header.Get("Expect") == "100-continue" {
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		body, _ := io.ReadAll(req.Body)
		if len(body) > 0 {
			bodies <- string(body)
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(body)+2)+"\r\n\r\nok"+string(body))
		if _, err := http.ReadRequest(br); err == nil {
			stale.Add(1) // closed unanswered, as if idle-closed just now
		}
	})
}

// readResponseHead reads one response head (1xx included) from br.
func readStatusLine(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading a status line: %v", err)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading a head: %v", err)
		}
		if l == "\r\n" {
			break
		}
	}
	return strings.TrimSpace(line)
}

// clientBehindStalePool starts a proxy in front of a backend that closes
// each connection after its first response, leaves one such connection in
// the pool with a first request, and returns a client connection to the
// proxy (closed with the test), with the backend's count of requests on
// closed connections and the bodies it received.
func clientBehindStalePool(t *testing.T) (net.Conn, *atomic.Int64, chan string) {
	t.Helper()
	stale := new(atomic.Int64)
	bodies := make(chan string, 4)
	m := startManager(t, proxyConfig(closingAfterFirstBackend(t, stale, bodies)), 1)
	a := addr(t, m, "web")
	if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
	c, err := net.DialTimeout("tcp", a, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(15 * time.Second))
	return c, stale, bodies
}

// TestExpectContinueRetriedOnStaleConnection: a POST with Expect:
// 100-continue sent on a pooled connection the upstream has just closed
// has sent nothing of its body (the client waits for 100 Continue), so
// it goes on a fresh connection: the client gets the 100 and the 200,
// not a 502.
func TestExpectContinueRetriedOnStaleConnection(t *testing.T) {
	c, stale, bodies := clientBehindStalePool(t)
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
	br := bufio.NewReader(c)
	if got := readStatusLine(t, br); got != "HTTP/1.1 100 Continue" {
		t.Fatalf("before the body: %q, want 100 Continue", got)
	}
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "okhello" {
		t.Fatalf("got %d %q, want 200 okhello", resp.StatusCode, b)
	}
	if stale.Load() != 1 {
		t.Fatalf("the upstream saw %d requests on a connection it closed, want 1: the test proves nothing", stale.Load())
	}
	if got := <-bodies; got != "hello" {
		t.Fatalf("upstream body %q", got)
	}
}

// TestPartlyForwardedBodyNotRetried: a POST whose body had started to
// go upstream when the pooled connection turned out closed is not sent
// again: the client gets the 502.
func TestPartlyForwardedBodyNotRetried(t *testing.T) {
	c, stale, bodies := clientBehindStalePool(t)
	// Part of the body comes with the head, so it goes with it.
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\nhello")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 {
		t.Fatalf("got %d, want 502: a partly sent body is not sent again", resp.StatusCode)
	}
	if stale.Load() != 1 {
		t.Fatalf("the upstream saw %d requests on a connection it closed, want 1: the test proves nothing", stale.Load())
	}
	select {
	case got := <-bodies:
		t.Fatalf("the upstream got a body %q on a retry", got)
	default:
	}
}
