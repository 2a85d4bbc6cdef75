package workers

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
)

// go test -run '^$' -bench . -benchmem ./workers/

func benchBackend(b *testing.B) *httptest.Server {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello, world\n")
	}))
	b.Cleanup(be.Close)
	return be
}

func benchGet(b *testing.B, url string) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(c.CloseIdleConnections)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode)
		}
	}
}

// BenchmarkHTTPDirect is the baseline: the client straight to the backend.
func BenchmarkHTTPDirect(b *testing.B) {
	benchGet(b, benchBackend(b).URL+"/")
}

// BenchmarkHTTPProxy is the same request through a Manager (one worker).
// The allocations reported include the client's and the backend's.
func BenchmarkHTTPProxy(b *testing.B) {
	be := benchBackend(b)
	m := startManager(b, proxyConfig(hostOf(be.URL)), 1)
	benchGet(b, "http://"+addr(b, m, "web")+"/")
}

// BenchmarkHTTPDirectResponse: a direct_response route, no upstream.
func BenchmarkHTTPDirectResponse(b *testing.B) {
	m := startManager(b, directConfig("hello, world\n"), 1)
	benchGet(b, "http://"+addr(b, m, "web")+"/")
}

func benchTCP(b *testing.B, addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	buf := make([]byte, 1<<20)
	rbuf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		errc := make(chan error, 1)
		go func() { _, err := c.Write(buf); errc <- err }()
		if _, err := io.ReadFull(c, rbuf); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}

func echoServer(b *testing.B) string {
	return rawBackend(b, func(c net.Conn) { io.Copy(c, c) })
}

// BenchmarkTCPDirect: 1 MiB echoed by the backend, no proxy.
func BenchmarkTCPDirect(b *testing.B) { benchTCP(b, echoServer(b)) }

// BenchmarkTCPProxy: the same through the TCP proxy.
func BenchmarkTCPProxy(b *testing.B) {
	m := startManager(b, tcpConfig(echoServer(b), 0), 1)
	benchTCP(b, addr(b, m, "tcp"))
}

// BenchmarkRequestStats is the stats work of one proxied HTTP request in
// isolation: the listener's request counter, status class and time
// histogram, and the cluster's request counter and time histogram, on one
// worker's lane. Its cost is mostly the four clock reads (time.Now costs
// 20-80 ns depending on the machine); it allocates nothing.
func BenchmarkRequestStats(b *testing.B) {
	st, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	ls := newListenerStats(st, "web", 0)
	us := upstream.NewStats(st, "backend", 1)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		ls.RqTotal.Inc()
		ls.RqActive.Inc()
		us.RqTotal.Inc()
		upStart := time.Now()
		us.RqTime.Record(float64(time.Since(upStart)) / float64(time.Millisecond))
		ls.Status(200)
		ls.RequestDone(time.Since(start))
		ls.RqActive.Dec()
	}
}

// rawKeepAliveBackend answers every request head (no body) with resp, on
// any number of connections, without allocating per request: a backend
// whose own allocations do not cloud the proxy's.
func rawKeepAliveBackend(tb testing.TB, resp string) string {
	return rawBackend(tb, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		out := []byte(resp)
		n := 0
		for {
			k, err := c.Read(buf[n:])
			if err != nil {
				return
			}
			n += k
			for {
				i := bytes.Index(buf[:n], []byte("\r\n\r\n"))
				if i < 0 {
					break
				}
				if _, err := c.Write(out); err != nil {
					return
				}
				n = copy(buf, buf[i+4:n])
			}
		}
	})
}

// benchRaw sends req on one keep-alive connection and reads a response of
// exactly respLen bytes, b.N times: the client allocates nothing per
// request either, so allocs/op is the proxy's.
func benchRaw(b *testing.B, addr, req string, respLen int) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	out := []byte(req)
	buf := make([]byte, respLen)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

const benchResponse = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n"

// BenchmarkH1ProxyKeepAlive: a proxied keep-alive request through the
// HTTP/1.1 data path; allocs/op are the proxy's alone (0 is the bar).
func BenchmarkH1ProxyKeepAlive(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be), 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// BenchmarkH1ProxyForwardingFields: the same with the fields the head
// writer now judges (issue 20): a client X-Request-Id kept, forged
// forwarding fields in both spellings dropped, an h2c upgrade taken out.
// Still 0 allocs/op.
func BenchmarkH1ProxyForwardingFields(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, func(l *config.Listener) { l.TrustForwardedFor = boolp(false) }), 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n" +
		"X-Request-Id: 4f1c2a9e-8d3b-4c5e-9f70-1a2b3c4d5e6f\r\nX-Forwarded-For: 1.2.3.4\r\nX_Forwarded_For: 1.2.3.4\r\n" +
		"X-Real-IP: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// BenchmarkH1ProxyPostSmallBody: the same with a small request body.
func BenchmarkH1ProxyPostSmallBody(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be), 1)
	a := addr(b, m, "web")
	// The backend answers at the end of the head; the body is 0 bytes
	// for it (it never reads bodies), so keep it out of its next head:
	// Content-Length bodies reach it as part of the same write.
	req := "POST /bench HTTP/1.1\r\nHost: bench.example\r\nContent-Length: 0\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// BenchmarkH1DirectResponse: a direct_response route, no upstream.
func BenchmarkH1DirectResponse(b *testing.B) {
	m := startManager(b, directConfig("hello, world\n"), 1)
	a := addr(b, m, "web")
	req := "GET / HTTP/1.1\r\nHost: bench.example\r\n\r\n"
	benchRaw(b, a, req, probeLen(b, a, req))
}

// probeLen is the length of the proxy's keep-alive response to req: the
// head, whose length does not vary (the request id has a fixed length),
// and the Content-Length body.
func probeLen(tb testing.TB, addr, req string) int {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, req)
	var cr countingReader
	cr.r = c
	resp, err := http.ReadResponse(bufio.NewReaderSize(&cr, 1), nil)
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.ContentLength < 0 {
		tb.Fatal("the benchmark response has no Content-Length")
	}
	return cr.n
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p[:min(len(p), 1)])
	c.n += n
	return n, err
}

// BenchmarkH1ProxyClose: a connection per proxied request (the client
// says Connection: close); allocs/op include the client's dial.
func BenchmarkH1ProxyClose(b *testing.B) { benchH1ProxyClose(b, 0) }

// BenchmarkH1ProxyCloseHeartbeat: BenchmarkH1ProxyClose with the accept
// loop's heartbeat on, at the default watchdog interval (miss_timeout/2):
// the watchdog's whole cost on the request path, a store and a listener
// deadline per accepted connection.
func BenchmarkH1ProxyCloseHeartbeat(b *testing.B) { benchH1ProxyClose(b, 100*time.Millisecond) }

func benchH1ProxyClose(b *testing.B, heartbeat time.Duration) {
	be := rawKeepAliveBackend(b, benchResponse)
	cfg := proxyConfig(be)
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 1)
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(Options{Concurrency: 1, Logger: testLogger(), HeartbeatInterval: heartbeat}, snap)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	m.Start()
	a := addr(b, m, "web")
	req := []byte("GET /bench HTTP/1.1\r\nHost: bench.example\r\nConnection: close\r\n\r\n")
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		c, err := net.Dial("tcp", a)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
		c.Close()
	}
}

// BenchmarkH1ProxyAccessLogMaglevRetry: BenchmarkH1ProxyKeepAlive with
// every feature of a route on: a JSON access log (formatted and written
// by its own goroutine, counted here too), maglev keyed by a header, and
// retry_on with a per-try timeout. It must allocate nothing per request
// either.
func BenchmarkH1ProxyAccessLogMaglevRetry(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	cfg := proxyConfig(be, func(l *config.Listener) {
		l.AccessLog = []config.AccessLog{{Path: filepath.Join(b.TempDir(), "access.log"), Format: config.AccessLogJSON}}
		l.Routes[0].RetryOn, l.Routes[0].NumRetries = []string{config.Retry5xx, config.RetryConnectFailure}, new(2)
		l.Routes[0].PerTryTimeout = config.Duration(5 * time.Second)
	})
	cfg.Clusters[0].LBPolicy, cfg.Clusters[0].HashOn = config.LBMaglev, "header:x-user"
	m := startManager(b, cfg, 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nX-User: alice\r\nAccept: */*\r\n\r\n"
	respLen := probeLen(b, a, req)
	benchRaw(b, a, req, respLen)
}

// BenchmarkH1TLSKeepAlive: BenchmarkH1ProxyKeepAlive over TLS (1.3,
// AES-GCM by default): the proxy's record decryption and encryption per
// request, and its idle wait, which reads instead of peeking. It reports
// 2 allocs/op, both crypto/tls's (readFromUntil's atLeastReader escapes):
// one for the proxy's record read, one for the client's; the proxy's own
// code adds none.
func BenchmarkH1TLSKeepAlive(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	cfg := proxyConfig(be, withTLS)
	// A plaintext twin of the listener, whose responses have the same
	// length, for probeLen (which speaks no TLS).
	cfg.Listeners = append(cfg.Listeners, httpListener("plain", toCluster("/", "backend")))
	m := startTLSManager(b, cfg, 1)
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	respLen := probeLen(b, addr(b, m, "plain"), req)
	c := dialTLS(b, addr(b, m, "web"), "a.example.com")
	c.SetDeadline(time.Time{})
	out := []byte(req)
	buf := make([]byte, respLen)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}
