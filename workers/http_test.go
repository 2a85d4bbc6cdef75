package workers

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// echoHeaders answers with the request's headers, one "Name: value" a line,
// plus "Host:" and the path.
func echoBackend(tb testing.TB) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo-body":
			http.NewResponseController(w).EnableFullDuplex()
			w.Header().Set("X-Got-Transfer-Encoding", strings.Join(r.TransferEncoding, ","))
			io.Copy(w, r.Body)
			return
		case "/chunked":
			for i := range 5 {
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
			}
			return
		case "/hop":
			w.Header().Set("Connection", "X-Secret")
			w.Header().Set("X-Secret", "hop")
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("X-Kept", "yes")
		}
		fmt.Fprintf(w, "Host: %s\nPath: %s\n", r.Host, r.URL.Path)
		for k, v := range r.Header {
			fmt.Fprintf(w, "%s: %s\n", k, strings.Join(v, ","))
		}
	}))
	tb.Cleanup(srv.Close)
	return srv
}

func headerLines(body string) map[string]string {
	h := map[string]string{}
	for line := range strings.SplitSeq(body, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			h[k] = v
		}
	}
	return h
}

func proxyConfig(backend string, l ...func(*config.Listener)) *config.Config {
	lst := httpListener("web", toCluster("/", "backend"))
	for _, f := range l {
		f(&lst)
	}
	return &config.Config{
		Listeners: []config.Listener{lst},
		Clusters:  []config.Cluster{cluster("backend", backend)},
	}
}

func TestHTTPProxy(t *testing.T) {
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 2)
	base := "http://" + addr(t, m, "web")
	c := newClient(t)

	t.Run("GET", func(t *testing.T) {
		resp, body := get(t, c, base+"/some/path?q=1", "Host", "app.example.com:8080")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		h := headerLines(body)
		if h["Host"] != "app.example.com:8080" || h["Path"] != "/some/path" {
			t.Errorf("host/path not kept: %q", body)
		}
		if h["X-Forwarded-For"] != "127.0.0.1" || h["X-Forwarded-Proto"] != "http" || h["X-Forwarded-Host"] != "app.example.com:8080" {
			t.Errorf("X-Forwarded-*: %q", body)
		}
		if id := h["X-Request-Id"]; len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Errorf("generated X-Request-Id %q", id)
		}
	})
	t.Run("request id kept", func(t *testing.T) {
		_, body := get(t, c, base+"/", "X-Request-Id", "abc-123")
		if id := headerLines(body)["X-Request-Id"]; id != "abc-123" {
			t.Errorf("X-Request-Id %q, want the client's", id)
		}
	})
	t.Run("client X-Forwarded-For appended", func(t *testing.T) {
		_, body := get(t, c, base+"/", "X-Forwarded-For", "10.1.2.3")
		if xff := headerLines(body)["X-Forwarded-For"]; xff != "10.1.2.3, 127.0.0.1" {
			t.Errorf("X-Forwarded-For %q", xff)
		}
	})
	t.Run("hop-by-hop removed", func(t *testing.T) {
		resp, body := get(t, c, base+"/hop", "Connection", "X-Drop-Me", "X-Drop-Me", "secret", "Keep-Alive", "timeout=1", "Proxy-Authorization", "x", "X-Stay", "1")
		h := headerLines(body)
		for _, k := range []string{"X-Drop-Me", "Keep-Alive", "Proxy-Authorization"} {
			if _, ok := h[k]; ok {
				t.Errorf("request hop-by-hop header %s reached the backend", k)
			}
		}
		if h["X-Stay"] != "1" {
			t.Errorf("end-to-end header lost: %q", body)
		}
		if resp.Header.Get("X-Secret") != "" || resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("X-Kept") != "yes" {
			t.Errorf("response headers %v", resp.Header)
		}
	})
	t.Run("POST 8MiB streamed", func(t *testing.T) {
		want := make([]byte, 8<<20)
		rand.Read(want)
		pr, pw := io.Pipe()
		go func() {
			for b := want; len(b) > 0; {
				n := min(len(b), 100_000)
				if _, err := pw.Write(b[:n]); err != nil {
					return
				}
				b = b[n:]
			}
			pw.Close()
		}()
		resp, err := c.Post(base+"/echo-body", "application/octet-stream", pr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("X-Got-Transfer-Encoding") != "chunked" {
			t.Errorf("backend saw Transfer-Encoding %q", resp.Header.Get("X-Got-Transfer-Encoding"))
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("body differs: got %d bytes, want %d", len(got), len(want))
		}
	})
	t.Run("chunked response", func(t *testing.T) {
		resp, err := c.Get(base + "/chunked")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Errorf("not chunked: length %d, encoding %v", resp.ContentLength, resp.TransferEncoding)
		}
		br := bufio.NewReader(resp.Body)
		for i := range 5 {
			line, err := br.ReadString('\n')
			if err != nil || line != fmt.Sprintf("chunk %d\n", i) {
				t.Fatalf("line %d: %q %v", i, line, err)
			}
		}
	})
	t.Run("upgrade", func(t *testing.T) {
		testUpgrade(t)
	})
	if rq2xx, cx := lstat(m, "downstream_rq_2xx"), lstat(m, statCxTotal); rq2xx < 6 || cx == 0 {
		t.Errorf("downstream_rq_2xx %d, downstream_cx_total %d", rq2xx, cx)
	}
}

// upgradeBackend answers an "Upgrade: echo" request with 101, then echoes.
func upgradeBackend(tb testing.TB) string {
	return rawBackend(tb, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get("Upgrade") != "echo" {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(c, br)
	})
}

// dialUpgrade opens an upgraded connection through the proxy at addr.
func dialUpgrade(tb testing.TB, addr string) (net.Conn, *bufio.Reader) {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "echo" {
		tb.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	return c, br
}

func echoLine(tb testing.TB, c net.Conn, br *bufio.Reader, msg string) error {
	tb.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	line, err := br.ReadString('\n')
	if err == nil && line != msg {
		tb.Fatalf("echo: got %q, want %q", line, msg)
	}
	return err
}

// testUpgrade: a raw backend answers 101 and echoes; the client talks
// through the proxy on the upgraded connection.
func testUpgrade(t *testing.T) {
	cfg := proxyConfig(upgradeBackend(t), func(l *config.Listener) { l.RequestTimeout = dur(300 * time.Millisecond) })
	m := startManager(t, cfg, 1)
	c, br := dialUpgrade(t, addr(t, m, "web"))
	// Outlive request_timeout: the upgraded connection must not be cut.
	time.Sleep(400 * time.Millisecond)
	for i := range 3 {
		if err := echoLine(t, c, br, fmt.Sprintf("hello %d\n", i)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHTTPAllEndpointsDown(t *testing.T) {
	cfg := proxyConfig(deadPort(t))
	cfg.Clusters[0].Endpoints = append(cfg.Clusters[0].Endpoints, deadPort(t))
	m := startManager(t, cfg, 1)
	start := time.Now()
	resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.StatusCode != http.StatusServiceUnavailable || body != "upstream connect error: connection refused\n" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestHTTPTimeout(t *testing.T) {
	release := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-body" {
			// Headers in time, then a body slower than
			// request_timeout: not a timeout.
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(400 * time.Millisecond):
			case <-release:
			}
			io.WriteString(w, "late body")
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(be.Close)
	t.Cleanup(func() { close(release) })
	cfg := proxyConfig(hostOf(be.URL), func(l *config.Listener) { l.RequestTimeout = dur(200 * time.Millisecond) })
	m := startManager(t, cfg, 1)
	c := newClient(t)
	start := time.Now()
	resp, body := get(t, c, "http://"+addr(t, m, "web")+"/stall")
	if resp.StatusCode != http.StatusGatewayTimeout || body != "upstream timeout\n" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	resp, body = get(t, c, "http://"+addr(t, m, "web")+"/slow-body")
	if resp.StatusCode != 200 || body != "late body" {
		t.Fatalf("slow body: got %d %q", resp.StatusCode, body)
	}
}

func TestHTTPMalformed(t *testing.T) {
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web", direct2("/", 200))}}
	cfg.Listeners[0].MaxHeaderBytes = 1024
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	if resp := rawRequest(t, a, "THIS IS NOT HTTP\r\n\r\n"); resp.StatusCode != 400 {
		t.Fatalf("malformed request line: %d", resp.StatusCode)
	}
	big := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\n\r\n"
	if resp := rawRequest(t, a, big); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers: %d", resp.StatusCode)
	}
	if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("after bad requests: %d", resp.StatusCode)
	}
}

func TestHTTPUpstreamResetMidResponse(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/ok" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n0123456789")
		c.(*net.TCPConn).SetLinger(0) // RST
	})
	m := startManager(t, proxyConfig(be), 1)
	base := "http://" + addr(t, m, "web")
	c := newClient(t)
	// The client must see a failure: no response at all, or a body cut
	// short (the headers may or may not have left the proxy's buffer).
	resp, err := c.Get(base + "/reset")
	if err == nil {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || len(b) >= 100000 {
			t.Fatalf("truncated response read without error: %d bytes", len(b))
		}
	}
	for range 3 {
		if resp, body := get(t, c, base+"/ok"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("after reset: %d %q", resp.StatusCode, body)
		}
	}
}

func TestHTTPNoEndpointBadResponse(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		bufio.NewReader(c).ReadString('\n')
		io.WriteString(c, "garbage\r\n\r\n")
	})
	m := startManager(t, proxyConfig(be), 1)
	resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.StatusCode != http.StatusBadGateway || body != "upstream sent a malformed response\n" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}
