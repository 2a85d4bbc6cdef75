package workers

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/smuggle"
)

// captureBackend is a raw HTTP/1.1 backend that records every byte it
// receives and answers each request head with a fixed response (it reads
// bodies by Content-Length only, which is all the proxy ever sends it
// unless it re-chunks, and then it answers after the terminating chunk).
type captureBackend struct {
	addr string
	mu   sync.Mutex
	got  bytes.Buffer
	n    int // requests answered
}

func newCaptureBackend(tb testing.TB, response string) *captureBackend {
	tb.Helper()
	cb := &captureBackend{}
	cb.addr = rawBackend(tb, func(c net.Conn) {
		br := bufio.NewReader(io.TeeReader(c, writerFunc(func(p []byte) {
			cb.mu.Lock()
			cb.got.Write(p)
			cb.mu.Unlock()
		})))
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			cb.mu.Lock()
			cb.n++
			cb.mu.Unlock()
			if _, err := io.WriteString(c, response); err != nil {
				return
			}
		}
	})
	return cb
}

func (cb *captureBackend) received() (string, int) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	return cb.got.String(), cb.n
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// exchangeRaw sends raw bytes on a fresh connection and returns everything
// the proxy sends back until it closes the connection (or 5 s pass).
func exchangeRaw(tb testing.TB, addr, raw string) (string, bool) {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		tb.Fatal(err)
	}
	b, err := io.ReadAll(c)
	closed := err == nil
	return string(b), closed
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// Every framing the proxy and a backend could disagree on is refused with
// 400 (414, 431, 505), the connection closes, and nothing reaches the
// backend; a forwarding field forged in a request trailer never reaches
// it either (the request itself is answered): the cases of
// internal/smuggle, which scripts/smuggle-check.sh also runs against
// nginx and HAProxy.
func TestSmugglingRefused(t *testing.T) {
	b, err := smuggle.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m := startManager(t, proxyConfig(b.Addr()), 1)
	a := addr(t, m, "web")
	for _, c := range smuggle.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			r, err := smuggle.Run(a, b, c)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Strict() {
				t.Errorf("not refused strictly: answer %q (want %s), %d responses, closed %v, backend received %q",
					r.Answer, c.Status, r.Responses, r.Closed, r.Reached)
			}
		})
	}
}

// TestSmugglingRefusedHTTP2: the HTTP/2 cases of internal/smuggle (issue
// 20, item 4), over h2c: each answered 400 or its stream reset, nothing
// forwarded.
func TestSmugglingRefusedHTTP2(t *testing.T) {
	b, err := smuggle.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m := startManager(t, proxyConfig(b.Addr(), h2cListener), 1)
	a := addr(t, m, "web")
	for _, c := range smuggle.H2Cases() {
		t.Run(c.Name, func(t *testing.T) {
			r, err := smuggle.RunH2(a, b, c)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Strict() {
				t.Errorf("not refused strictly: answer %q (want %s), backend received %q", r.Answer, c.Status, r.Reached)
			}
		})
	}
}

// A proxy never invents a Content-Type.
func TestNoContentTypeSniffing(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n<html>hi</html>")
	})
	m := startManager(t, proxyConfig(be), 1)
	resp, _ := exchangeRaw(t, addr(t, m, "web"), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if strings.Contains(strings.ToLower(resp), "content-type") {
		t.Fatalf("a Content-Type was added:\n%s", resp)
	}
}

// Routes match the normalised path: dot segments, duplicate slashes, ';'
// parameters and encoded dots do not get around a route.
func TestPathConfusionMatchesTheRoute(t *testing.T) {
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Path: "/admin", DirectResponse: &config.DirectResponse{Status: 403, Body: "denied"}},
		config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "public"}})}}
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	for _, p := range []string{"/admin", "/x/../admin", "//admin", "/admin;x", "/x/%2e%2e/admin", "/./admin", "/admin?q=1"} {
		resp, _ := exchangeRaw(t, a, "GET "+p+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 403 ") {
			t.Errorf("GET %s: %q, want the /admin route (403)", p, firstLine(resp))
		}
	}
}

// Pipelined requests are answered in order, and a response is flushed
// without waiting for the next request.
func TestPipelining(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	raw := "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" +
		"GET /3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	resp, closed := exchangeRaw(t, addr(t, m, "web"), raw)
	if n := strings.Count(resp, "HTTP/1.1 200 OK"); n != 3 || !closed {
		t.Fatalf("%d responses (closed %v), want 3:\n%s", n, closed, resp)
	}
	got, n := cb.received()
	if n != 3 || strings.Index(got, "/1 ") > strings.Index(got, "/2 ") || strings.Index(got, "/2 ") > strings.Index(got, "/3 ") || !strings.Contains(got, "abc") {
		t.Fatalf("backend got %d requests:\n%s", n, got)
	}
}

// Chunked both ways, with trailers; sizes re-emitted by the proxy.
func TestChunkedBothWaysWithTrailers(t *testing.T) {
	var seen string
	var mu sync.Mutex
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		mu.Lock()
		seen = string(body) + "|" + req.Trailer.Get("X-Sum")
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Resp\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Resp: done\r\n\r\n")
	})
	m := startManager(t, proxyConfig(be), 1)
	resp, _ := exchangeRaw(t, addr(t, m, "web"), "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nConnection: close\r\n\r\n"+
		"004\r\nwiki\r\n5;name=val\r\npedia\r\n0\r\nX-Sum: 9\r\n\r\n")
	r, err := http.ReadResponse(bufio.NewReader(strings.NewReader(resp)), nil)
	if err != nil {
		t.Fatalf("%v:\n%s", err, resp)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || string(body) != "abcde" || r.Trailer.Get("X-Resp") != "done" {
		t.Fatalf("response body %q trailer %q err %v:\n%s", body, r.Trailer.Get("X-Resp"), err, resp)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen != "wikipedia|9" {
		t.Fatalf("backend saw %q, want body wikipedia and trailer 9", seen)
	}
}

// An HTTP/1.0 client gets a chunked response de-chunked, ending with the
// connection.
func TestHTTP10ClientDechunked(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
	})
	m := startManager(t, proxyConfig(be), 1)
	resp, closed := exchangeRaw(t, addr(t, m, "web"), "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	if !closed || !strings.HasSuffix(resp, "\r\n\r\nabc") || strings.Contains(strings.ToLower(resp), "chunked") {
		t.Fatalf("closed %v, response:\n%q", closed, resp)
	}
}

// Expect: 100-continue is forwarded: an upstream that refuses the upload
// answers before the body is sent, and one that accepts gets the body
// after the client sees 100 Continue.
func TestExpectContinue(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/refuse" {
			io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		}
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		body, _ := io.ReadAll(req.Body)
		// Connection: close, as this backend closes after one exchange:
		// the next request must not race that close on a pooled
		// connection (a request whose body is still unread is not
		// replayed there, so it would be a 502, not the 413 tested).
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+string(body))
	})
	m := startManager(t, proxyConfig(be), 1)
	a := addr(t, m, "web")

	c, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "PUT /accept HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("first line %q, %v; want 100 Continue before the body", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "hello")
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != 200 || string(body) != "hello" {
		t.Fatalf("got %d %q", r.StatusCode, body)
	}

	c2, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c2, "PUT /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
	r, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || r.StatusCode != 413 {
		t.Fatalf("refused upload: %v %v, want 413 without sending the body", r, err)
	}
}

// An upstream that answers early while a large upload is still arriving
// gets its answer to the client at once; the client connection then
// closes, never a stall until a timeout.
func TestEarlyAnswerDuringUpload(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
		// A lingering close, as servers do: a close with the upload
		// unread would reset the connection, answer and all.
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
	})
	m := startManager(t, proxyConfig(be), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 50 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != 401 || string(body) != "nope" || !r.Close {
		t.Fatalf("got %d %q close=%v", r.StatusCode, body, r.Close)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the early answer took %v", d)
	}
}

// A client that stops reading a large response is cut by write_timeout,
// and its upstream connection is given up.
func TestSlowReaderCutByWriteTimeout(t *testing.T) {
	big := strings.Repeat("z", 32<<20)
	be := rawBackend(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n"+big)
	})
	m := startManager(t, proxyConfig(be, func(l *config.Listener) { l.WriteTimeout = dur(300 * time.Millisecond) }), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	// Read nothing: the proxy must give up on us.
	waitFor(t, 10*time.Second, "the slow reader cut", func() bool { return m.workers[0].conns.len() == 0 })
}

// A client that sends its head slowly is cut by header_timeout
// (slowloris) with 408.
func TestSlowlorisCutByHeaderTimeout(t *testing.T) {
	m := startManager(t, proxyConfig("127.0.0.1:1", func(l *config.Listener) { l.HeaderTimeout = dur(200 * time.Millisecond) }), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 408 ") {
		t.Fatalf("got %q, want 408", b)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("cut after %v", d)
	}
}

// On a keep-alive connection the next request's head is cut by
// header_timeout too, from its first byte, not by the idle timeout that
// the wait for it had armed.
func TestSlowlorisOnKeepAliveCutByHeaderTimeout(t *testing.T) {
	be := rawKeepAliveBackend(t, benchResponse)
	m := startManager(t, proxyConfig(be, func(l *config.Listener) {
		l.HeaderTimeout = dur(200 * time.Millisecond)
		l.IdleTimeout = dur(time.Minute)
	}), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	b, _ := io.ReadAll(br)
	if !strings.HasPrefix(string(b), "HTTP/1.1 408 ") {
		t.Fatalf("got %q, want 408", b)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("cut after %v, header_timeout is 200ms", d)
	}
}

// A pooled connection the upstream closed while idle is found by the next
// request, which is retried once on a fresh connection (it is a GET).
func TestStalePooledConnectionRetried(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		// One request per connection, without saying so: the proxy
		// pools the connection, and the next request meets its close.
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, okResponse)
	})
	m := startManager(t, proxyConfig(be), 1)
	a := addr(t, m, "web")
	for i := range 5 {
		resp, _ := exchangeRaw(t, a, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200 ") {
			t.Fatalf("request %d: %q", i, firstLine(resp))
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	return line
}

// Responses without a body (HEAD, 204, 304, and 1xx before a final
// answer) keep the connection in step: the next request on it is answered
// normally, and a HEAD keeps its Content-Length.
func TestBodilessResponsesKeepFraming(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			switch req.URL.Path {
			case "/head":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
			case "/204":
				io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
			case "/304":
				io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n")
			case "/103":
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			default:
				io.WriteString(c, okResponse)
			}
		}
	})
	m := startManager(t, proxyConfig(be), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	ask := func(method, path string) *http.Response {
		t.Helper()
		io.WriteString(c, method+" "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		req, _ := http.NewRequest(method, path, nil)
		for {
			r, err := http.ReadResponse(br, req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode >= 200 {
				return r
			}
			if r.StatusCode != 103 || r.Header.Get("Link") == "" {
				t.Fatalf("interim %d %v", r.StatusCode, r.Header)
			}
		}
	}
	if r := ask("HEAD", "/head"); r.StatusCode != 200 || r.ContentLength != 100 {
		t.Fatalf("HEAD: %d Content-Length %d, want 200 and the upstream's 100", r.StatusCode, r.ContentLength)
	}
	if r := ask("GET", "/204"); r.StatusCode != 204 {
		t.Fatalf("204: %d", r.StatusCode)
	}
	if r := ask("GET", "/304"); r.StatusCode != 304 || r.Header.Get("ETag") == "" {
		t.Fatalf("304: %d %v", r.StatusCode, r.Header)
	}
	if r := ask("GET", "/103"); r.StatusCode != 200 {
		t.Fatalf("after 103: %d", r.StatusCode)
	}
	if r := ask("GET", "/after"); r.StatusCode != 200 {
		t.Fatalf("the connection is out of step: %d", r.StatusCode)
	}
}

// A Connection header naming Host cannot strip it, and an HTTP/1.0
// request without Host still sends the upstream one.
func TestHostAlwaysReachesTheUpstream(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	a := addr(t, m, "web")
	exchangeRaw(t, a, "GET /a HTTP/1.1\r\nHost: app.example\r\nConnection: close, host\r\n\r\n")
	exchangeRaw(t, a, "GET /b HTTP/1.0\r\n\r\n")
	got, n := cb.received()
	if n != 2 || !strings.Contains(got, "GET /a HTTP/1.1\r\nHost: app.example\r\n") || !strings.Contains(got, "GET /b HTTP/1.1\r\nHost: backend\r\n") {
		t.Fatalf("backend got %d requests:\n%s", n, got)
	}
	if strings.Count(strings.ToLower(got), "\r\nhost:") != 2 {
		t.Fatalf("a request carried Host twice:\n%s", got)
	}
}

// CONNECT opens a tunnel only through a route with connect = true for the
// target's host: 200, then the bytes both ways to the cluster; elsewhere
// it is refused with 405 and nothing is dialed.
func TestConnectTunnel(t *testing.T) {
	var dialed atomic.Int64
	echo := rawBackend(t, func(c net.Conn) {
		dialed.Add(1)
		io.Copy(c, c)
	})
	cfg := &config.Config{
		Listeners: []config.Listener{httpListener("web",
			config.Route{Host: "tunnel.example", Prefix: "/", Cluster: "echo", Connect: true},
			config.Route{Prefix: "/", Cluster: "echo"})},
		Clusters: []config.Cluster{cluster("echo", echo)},
	}
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")

	c, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// The first tunnel bytes ride with the CONNECT itself.
	io.WriteString(c, "CONNECT tunnel.example:443 HTTP/1.1\r\nHost: tunnel.example:443\r\n\r\nping")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200 ") {
		t.Fatalf("CONNECT answered %q, %v", line, err)
	}
	if blank, _ := br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("the 200 has a head %q", blank)
	}
	buf := make([]byte, 8)
	if _, err := io.ReadFull(br, buf[:4]); err != nil || string(buf[:4]) != "ping" {
		t.Fatalf("echo through the tunnel: %q, %v", buf[:4], err)
	}
	io.WriteString(c, "pong")
	if _, err := io.ReadFull(br, buf[:4]); err != nil || string(buf[:4]) != "pong" {
		t.Fatalf("second echo: %q, %v", buf[:4], err)
	}
	c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after a half-close the tunnel sent %q, %v; want a clean EOF", rest, err)
	}

	before := dialed.Load()
	resp, closed := exchangeRaw(t, a, "CONNECT other.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 405 ") || !closed {
		t.Fatalf("CONNECT to a host no route lets through: %q (closed %v), want 405", firstLine(resp), closed)
	}
	if dialed.Load() != before {
		t.Fatal("a refused CONNECT dialed the cluster")
	}
}

// A head that arrives a byte at a time is parsed once per line, not once
// per byte, and still answered; a request line that never ends is still
// cut at its limit (414), and a head at its limit (431).
func TestHeadByteByByte(t *testing.T) {
	m := startManager(t, directConfig("ok"), 1)
	a := addr(t, m, "web")
	send := func(raw string) string {
		t.Helper()
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		for i := 0; i < len(raw); i++ {
			if _, err := c.Write([]byte{raw[i]}); err != nil {
				break // the proxy answered and closed early
			}
		}
		b, _ := io.ReadAll(c)
		return firstLine(string(b))
	}
	if got := send("GET / HTTP/1.1\r\nHost: x\r\nX-A: " + strings.Repeat("b", 300) + "\r\nConnection: close\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Fatalf("a head sent a byte at a time: %q", got)
	}
	if got := send("GET /" + strings.Repeat("a", 8300)); !strings.HasPrefix(got, "HTTP/1.1 414 ") {
		t.Fatalf("an endless request line sent a byte at a time: %q, want 414", got)
	}
}

// max_idle_per_endpoint = 0 keeps no idle upstream connection, from the
// config through the proxy: every request reaches the backend on a
// connection of its own. The default keeps one and reuses it.
func TestMaxIdlePerEndpointThroughTheProxy(t *testing.T) {
	for _, tc := range []struct {
		maxIdle   int
		wantConns int64
	}{{0, 5}, {config.DefaultMaxIdlePerEndpoint, 1}} {
		var conns atomic.Int64
		be := rawBackend(t, func(c net.Conn) {
			conns.Add(1)
			br := bufio.NewReader(c)
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, okResponse)
			}
		})
		// Parsed from TOML, as a user writes it: config.Load is what
		// tells an explicit 0 from a key left out.
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
[[listeners]]
name = "web"
address = "127.0.0.1:0"
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  cluster = "backend"
[[clusters]]
name = "backend"
endpoints = [%q]
max_idle_per_endpoint = %d
`, be, tc.maxIdle)), "test.toml")
		if err != nil {
			t.Fatal(err)
		}
		snap, err := BuildSnapshotN(cfg, Identity{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Options{Concurrency: 1, Logger: testLogger()}, snap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.Start()
		c, err := net.Dial("tcp", addr(t, m, "web"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		for range 5 {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			r, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
		}
		c.Close()
		if got := conns.Load(); got != tc.wantConns {
			t.Errorf("max_idle_per_endpoint = %d: 5 requests opened %d upstream connections, want %d", tc.maxIdle, got, tc.wantConns)
		}
	}
}
