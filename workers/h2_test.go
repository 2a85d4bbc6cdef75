package workers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// h2cListener makes a test listener accept HTTP/2 with prior knowledge.
func h2cListener(l *config.Listener) { l.HTTP2Cleartext = true }

// h2cClient is an HTTP/2 client with prior knowledge over cleartext: every
// request of it to one address shares one connection.
func h2cClient(tb testing.TB) *http.Client {
	tb.Helper()
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// seenRequest is what a backend saw of a request.
type seenRequest struct {
	proto, method, uri, host string
	header                   http.Header
	body                     string
	trailer                  http.Header
}

// recordingBackend is an HTTP/1.1 backend that records each request and
// answers with its body, a hop-by-hop header the proxy must drop, and the
// response trailer "X-Checksum" (chunked) when the path is /trailer.
func recordingBackend(tb testing.TB) (string, <-chan seenRequest) {
	tb.Helper()
	seen := make(chan seenRequest, 256)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- seenRequest{r.Proto, r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(b), r.Trailer.Clone()}
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Backend", "h1")
		if r.URL.Path == "/trailer" {
			w.Header().Set("Trailer", "X-Checksum")
			io.WriteString(w, "with trailer")
			w.(http.Flusher).Flush() // chunked
			w.Header().Set("X-Checksum", "abc123")
			return
		}
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	tb.Cleanup(be.Close)
	return hostOf(be.URL), seen
}

func h2Do(tb testing.TB, c *http.Client, req *http.Request) (*http.Response, string) {
	tb.Helper()
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: body: %v", req.Method, req.URL, err)
	}
	if resp.ProtoMajor != 2 {
		tb.Fatalf("%s %s: answered in %s, want HTTP/2", req.Method, req.URL, resp.Proto)
	}
	return resp, string(b)
}

func newReq(tb testing.TB, method, url string, body io.Reader) *http.Request {
	tb.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		tb.Fatal(err)
	}
	return req
}

// checkForwarded asserts the hop-by-hop and forwarding headers of a
// request as the HTTP/1.1 backend got it.
func checkForwarded(t *testing.T, s seenRequest, host string) {
	t.Helper()
	if s.proto != "HTTP/1.1" {
		t.Errorf("backend got %s, want HTTP/1.1", s.proto)
	}
	if s.host != host {
		t.Errorf("backend Host %q, want %q (from :authority)", s.host, host)
	}
	for _, h := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Upgrade", "Te", "Transfer-Encoding"} {
		if v, ok := s.header[h]; ok {
			t.Errorf("backend got hop-by-hop header %s: %q", h, v)
		}
	}
	if got := s.header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want 127.0.0.1", got)
	}
	if got := s.header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto %q, want http", got)
	}
	if s.header.Get("X-Request-Id") == "" {
		t.Errorf("no X-Request-Id")
	}
}

// TestH2CProxyToHTTP1 sends a GET, a POST with a Content-Length body and a
// POST whose body has no declared length over HTTP/2 prior knowledge, to
// an HTTP/1.1 backend: method, path, Host and body arrive, the hop-by-hop
// headers do not, and the stats count them as HTTP/2 requests.
func TestH2CProxyToHTTP1(t *testing.T) {
	be, seen := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	base := "http://" + addr(t, m, "web")
	c := h2cClient(t)

	req := newReq(t, "GET", base+"/get/a?q=1", nil)
	req.Host = "svc.example.com"
	req.Header.Set("Te", "trailers") // the one TE HTTP/2 allows; never to an HTTP/1.1 upstream
	resp, body := h2Do(t, c, req)
	if resp.StatusCode != 200 || body != "GET /get/a " {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Backend") != "h1" || resp.Header.Get("Keep-Alive") != "" {
		t.Errorf("response headers %v: want X-Backend, and no Keep-Alive", resp.Header)
	}
	s := <-seen
	if s.method != "GET" || s.uri != "/get/a?q=1" || s.body != "" {
		t.Errorf("backend saw %s %s body %q", s.method, s.uri, s.body)
	}
	checkForwarded(t, s, "svc.example.com")

	payload := strings.Repeat("x", 100<<10) // more than one DATA frame and one read
	req = newReq(t, "POST", base+"/post", strings.NewReader(payload))
	resp, body = h2Do(t, c, req)
	if resp.StatusCode != 200 || body != "POST /post "+payload {
		t.Fatalf("POST: %d, body of %d bytes", resp.StatusCode, len(body))
	}
	s = <-seen
	if s.method != "POST" || s.body != payload || s.header.Get("Content-Length") != "102400" {
		t.Errorf("backend saw %s with %d body bytes", s.method, len(s.body))
	}
	checkForwarded(t, s, addr(t, m, "web"))

	// No declared length: chunked to the upstream, trailers included.
	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, "part one, ")
		io.WriteString(pw, "part two")
		pw.Close()
	}()
	req = newReq(t, "POST", base+"/stream", pr)
	req.Trailer = http.Header{"X-Sum": nil}
	req.Trailer.Set("X-Sum", "42")
	resp, body = h2Do(t, c, req)
	if resp.StatusCode != 200 || body != "POST /stream part one, part two" {
		t.Fatalf("streamed POST: %d %q", resp.StatusCode, body)
	}
	s = <-seen
	if s.trailer.Get("X-Sum") != "42" {
		t.Errorf("request trailer X-Sum %q, want 42", s.trailer.Get("X-Sum"))
	}

	if got := lstat(m, httpfront.StatRqHTTP2); got != 3 {
		t.Errorf("%s = %d, want 3", httpfront.StatRqHTTP2, got)
	}
	if got := lstat(m, statRqTotal); got != 3 {
		t.Errorf("%s = %d, want 3", statRqTotal, got)
	}
	if got := lstat(m, "downstream_rq_2xx"); got != 3 {
		t.Errorf("downstream_rq_2xx = %d, want 3", got)
	}
	if got := lstat(m, statCxTotal); got != 1 {
		t.Errorf("%s = %d, want 1 (one HTTP/2 connection)", statCxTotal, got)
	}
	if got := counter(m, "cluster.backend.upstream_rq_total"); got != 3 {
		t.Errorf("cluster upstream_rq_total = %d, want 3", got)
	}
	waitFor(t, 5*time.Second, "no request active", func() bool { return gauge(m, "listener.web."+statRqActive) == 0 })
}

// TestH2CResponseTrailers: a chunked HTTP/1.1 response's trailer reaches
// the HTTP/2 client as an HTTP/2 trailer.
func TestH2CResponseTrailers(t *testing.T) {
	be, _ := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	resp, body := h2Do(t, h2cClient(t), newReq(t, "GET", "http://"+addr(t, m, "web")+"/trailer", nil))
	if body != "with trailer" || resp.Trailer.Get("X-Checksum") != "abc123" {
		t.Fatalf("body %q trailer %v, want the X-Checksum trailer", body, resp.Trailer)
	}
}

// TestH2CConcurrentStreams runs many requests at once on one connection.
func TestH2CConcurrentStreams(t *testing.T) {
	be, seen := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener), 2)
	base := "http://" + addr(t, m, "web")
	c := h2cClient(t)
	h2Do(t, c, newReq(t, "GET", base+"/warm", nil)) // one connection, then streams on it
	<-seen
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(fmt.Sprintf("%s/s/%d", base, i))
			if err != nil {
				errs <- err
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := fmt.Sprintf("GET /s/%d ", i); err != nil || string(b) != want {
				errs <- fmt.Errorf("stream %d: %q, %v (want %q)", i, b, err, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := lstat(m, statCxTotal); got != 1 {
		t.Errorf("%s = %d, want 1: the streams shared one connection", statCxTotal, got)
	}
	if got := lstat(m, httpfront.StatRqHTTP2); got != n+1 {
		t.Errorf("%s = %d, want %d", httpfront.StatRqHTTP2, got, n+1)
	}
}

// TestH2CDirectAndNoRoute: a direct response, and a 404 when no route
// matches, both over HTTP/2 and counted.
func TestH2CDirectAndNoRoute(t *testing.T) {
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Prefix: "/hello", DirectResponse: &config.DirectResponse{Status: 201, Body: "hi from %EPOCH%"}})}}
	cfg.Listeners[0].HTTP2Cleartext = true
	m := startManager(t, cfg, 1)
	base := "http://" + addr(t, m, "web")
	c := h2cClient(t)
	resp, body := h2Do(t, c, newReq(t, "GET", base+"/hello", nil))
	if resp.StatusCode != 201 || body != "hi from 0" || resp.Header.Get("Content-Length") != "9" {
		t.Errorf("direct: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = h2Do(t, c, newReq(t, "GET", base+"/other", nil))
	if resp.StatusCode != 404 || body != httpfront.NoRouteBody+"\n" {
		t.Errorf("no route: %d %q", resp.StatusCode, body)
	}
	if a, b := lstat(m, "downstream_rq_2xx"), lstat(m, "downstream_rq_4xx"); a != 1 || b != 1 {
		t.Errorf("rq_2xx = %d, rq_4xx = %d, want 1 and 1", a, b)
	}
}

// TestH2CPrefaceWithoutCleartext: without http2_cleartext the preface
// gets HTTP/1.1's answer, as before.
func TestH2CPrefaceWithoutCleartext(t *testing.T) {
	m := startManager(t, directConfig("ok"), 1)
	resp := rawRequest(t, addr(t, m, "web"), http2.ClientPreface)
	if resp.StatusCode != 505 {
		t.Fatalf("preface on an HTTP/1.1-only listener: %d, want 505", resp.StatusCode)
	}
	if got := lstat(m, httpfront.StatRqHTTP2); got != 0 {
		t.Fatalf("%s = %d, want 0", httpfront.StatRqHTTP2, got)
	}
}

// TestH2CAndHTTP1OnOneListener: http2_cleartext keeps HTTP/1.1 working.
func TestH2CAndHTTP1OnOneListener(t *testing.T) {
	be, _ := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/one")
	if resp.ProtoMajor != 1 || body != "GET /one " {
		t.Fatalf("HTTP/1.1 on an h2c listener: %s %q", resp.Proto, body)
	}
}

// rawH2Conn is a hand-driven HTTP/2 client connection, to see frames (a
// GOAWAY) that Go's client keeps to itself.
type rawH2Conn struct {
	c   net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func dialRawH2(tb testing.TB, addr string) *rawH2Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	rc := &rawH2Conn{c: c, fr: http2.NewFramer(c, c)}
	rc.enc = hpack.NewEncoder(&rc.hb)
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		tb.Fatal(err)
	}
	if err := rc.fr.WriteSettings(); err != nil {
		tb.Fatal(err)
	}
	return rc
}

// get sends a GET on stream, with more header fields as name, value pairs.
func (rc *rawH2Conn) get(tb testing.TB, stream uint32, authority, path string, fields ...string) {
	tb.Helper()
	rc.hb.Reset()
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", authority}, {":path", path}} {
		rc.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i+1 < len(fields); i += 2 {
		rc.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: rc.hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		tb.Fatal(err)
	}
}

// TestH2CDrainGoAway: a drain sends a GOAWAY to an HTTP/2 connection with
// a stream in flight; the stream still completes, then the connection
// closes and the drain ends by itself.
func TestH2CDrainGoAway(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "finished")
	}))
	t.Cleanup(be.Close)
	releaseBackend := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseBackend) // before be.Close, which waits for the handler
	m := startManager(t, proxyConfig(hostOf(be.URL), h2cListener), 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	rc.get(t, 1, a, "/slow")
	rc.c.SetDeadline(time.Now().Add(5 * time.Second)) // a GOAWAY comes at once, or never
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the backend")
	}

	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 15 * time.Second}) }()

	var goAway *http2.GoAwayFrame
	var status string
	var body []byte
	ended := false
	for !ended {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading frames (GOAWAY seen: %v, status %q): %v", goAway != nil, status, err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goAway = f
			releaseBackend() // the backend answers only once the GOAWAY is out
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			status = f.PseudoValue("status")
			ended = f.StreamEnded()
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			ended = f.StreamEnded()
		}
	}
	if goAway == nil || goAway.ErrCode != http2.ErrCodeNo {
		t.Fatalf("stream ended without a graceful GOAWAY before it (%v)", goAway)
	}
	if goAway.LastStreamID < 1 {
		t.Errorf("GOAWAY last stream %d: the stream in flight would not be processed", goAway.LastStreamID)
	}
	if status != "200" || string(body) != "finished" {
		t.Fatalf("stream in flight: status %q body %q, want 200 \"finished\"", status, body)
	}
	// The server closes the connection once its last stream is done.
	for {
		if _, err := rc.fr.ReadFrame(); err != nil {
			break
		}
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("drain: %v (want it to finish by itself)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("drain did not end")
	}
	if n := cxActive(m); n != 0 {
		t.Errorf("downstream_cx_active = %d after the drain", n)
	}
}

// h2cBackend is an HTTP/2 cleartext (prior knowledge) backend that
// answers with what it saw, and a trailer.
func h2cBackend(tb testing.TB) (string, <-chan seenRequest) {
	tb.Helper()
	seen := make(chan seenRequest, 64)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- seenRequest{r.Proto, r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(b), r.Trailer.Clone()}
		w.Header().Set("Trailer", "X-Upstream-Trailer")
		fmt.Fprintf(w, "%s %s %s %s", r.Proto, r.Method, r.URL.Path, b)
		w.Header().Set("X-Upstream-Trailer", "t1")
	})
	be := httptest.NewServer(h2c.NewHandler(h, &http2.Server{}))
	tb.Cleanup(be.Close)
	return hostOf(be.URL), seen
}

// TestH2UpstreamCleartext: an HTTP/2 client's requests reach a cluster
// with http2 = true as HTTP/2 (prior knowledge), body and trailers both
// ways, and the cluster counts them.
func TestH2UpstreamCleartext(t *testing.T) {
	be, seen := h2cBackend(t)
	cfg := proxyConfig(be, h2cListener)
	cfg.Clusters[0].HTTP2 = true
	m := startManager(t, cfg, 1)
	base := "http://" + addr(t, m, "web")
	c := h2cClient(t)
	req := newReq(t, "POST", base+"/up?x=1", strings.NewReader("payload"))
	req.Host = "api.example.com"
	req.Header.Set("Te", "trailers")
	resp, body := h2Do(t, c, req)
	if resp.StatusCode != 200 || body != "HTTP/2.0 POST /up payload" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if resp.Trailer.Get("X-Upstream-Trailer") != "t1" {
		t.Errorf("trailer %v, want X-Upstream-Trailer: t1", resp.Trailer)
	}
	s := <-seen
	if s.proto != "HTTP/2.0" || s.host != "api.example.com" || s.uri != "/up?x=1" || s.body != "payload" {
		t.Errorf("backend saw %s %s %s host %q body %q", s.proto, s.method, s.uri, s.host, s.body)
	}
	if s.header.Get("Te") != "trailers" || s.header.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("backend headers %v: want TE: trailers and X-Forwarded-For", s.header)
	}
	for range 5 {
		h2Do(t, c, newReq(t, "GET", base+"/again", nil))
		<-seen
	}
	if got := counter(m, "cluster.backend.upstream_cx_total"); got != 1 {
		t.Errorf("upstream_cx_total = %d, want 1: requests share one HTTP/2 connection", got)
	}
	if got := counter(m, "cluster.backend.upstream_rq_total"); got != 6 {
		t.Errorf("upstream_rq_total = %d, want 6", got)
	}
}

// TestH2UpstreamTLS: clusters.http2 with TLS negotiates h2 by ALPN.
func TestH2UpstreamTLS(t *testing.T) {
	be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %v", r.Proto, r.TLS != nil)
	}))
	be.EnableHTTP2 = true
	be.StartTLS()
	t.Cleanup(be.Close)
	cfg := proxyConfig(strings.TrimPrefix(be.URL, "https://"), h2cListener)
	cfg.Clusters[0].HTTP2 = true
	cfg.Clusters[0].TLS = &config.ClusterTLS{InsecureSkipVerify: true, MinVersion: "1.2"}
	m := startManager(t, cfg, 1)
	resp, body := h2Do(t, h2cClient(t), newReq(t, "GET", "http://"+addr(t, m, "web")+"/", nil))
	if resp.StatusCode != 200 || body != "HTTP/2.0 true" {
		t.Fatalf("%d %q, want the backend to see HTTP/2 over TLS", resp.StatusCode, body)
	}
}

// TestH2CCurl: curl's HTTP/2 with prior knowledge, a client that is not
// Go's.
func TestH2CCurl(t *testing.T) {
	out, err := exec.Command("curl", "--version").Output()
	if err != nil || !bytes.Contains(out, []byte("HTTP2")) {
		t.Skip("curl with HTTP/2 support is not installed")
	}
	be, seen := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	cmd := exec.Command("curl", "-sS", "--http2-prior-knowledge", "-w", " %{http_version} %{response_code}",
		"-d", "curl body", "http://"+addr(t, m, "web")+"/curl")
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v: %s", err, got)
	}
	if want := "POST /curl curl body 2 200"; string(got) != want {
		t.Fatalf("curl printed %q, want %q", got, want)
	}
	if s := <-seen; s.body != "curl body" {
		t.Errorf("backend body %q", s.body)
	}
}

// BenchmarkH2CProxyKeepAlive: sequential GETs on one HTTP/2 connection
// through the proxy to the HTTP/1.1 backend of BenchmarkH1ProxyKeepAlive
// (client included: Go's HTTP/2 client costs about as much as the proxy).
func BenchmarkH2CProxyKeepAlive(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, h2cListener), 1)
	c := h2cClient(b)
	url := "http://" + addr(b, m, "web") + "/"
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

// BenchmarkH2CDirectResponse: a direct_response route over HTTP/2, no
// upstream: the HTTP/2 server's own cost (and the client's).
func BenchmarkH2CDirectResponse(b *testing.B) {
	cfg := directConfig("hello, world\n")
	h2cListener(&cfg.Listeners[0])
	m := startManager(b, cfg, 1)
	c := h2cClient(b)
	url := "http://" + addr(b, m, "web") + "/"
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestH2CHeaderLimit: max_header_bytes bounds an HTTP/2 request's header
// list: a larger one is refused with 431, and the connection goes on.
func TestH2CHeaderLimit(t *testing.T) {
	be, seen := recordingBackend(t)
	m := startManager(t, proxyConfig(be, h2cListener, func(l *config.Listener) { l.MaxHeaderBytes = 4096 }), 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	var big []string // more than 4 KiB in all, no field too long for HPACK's bound
	for i := range 10 {
		big = append(big, fmt.Sprintf("x-big-%d", i), strings.Repeat("b", 600))
	}
	rc.get(t, 1, a, "/big", big...)
	rc.get(t, 3, a, "/small")
	got := map[uint32]string{}
	for len(got) < 2 {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading frames (statuses so far %v): %v", got, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			// x/net adds HTTP/2's per-field overhead (32 bytes) for
			// up to 10 fields.
			if v, ok := f.Value(http2.SettingMaxHeaderListSize); ok && v != 4096+320 {
				t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE %d, want 4096+320", v)
			}
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			got[f.StreamID] = f.PseudoValue("status")
		}
	}
	if got[1] != "431" || got[3] != "200" {
		t.Fatalf("statuses %v, want stream 1: 431, stream 3: 200", got)
	}
	if s := <-seen; s.uri != "/small" {
		t.Fatalf("backend saw %q, want only /small", s.uri)
	}
}

// TestH2CEarlyResponse: an upstream that answers before the request body
// is complete (413) is heard at once; the body still streaming does not
// hold the answer back.
func TestH2CEarlyResponse(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		n := 0
		for !bytes.Contains(buf[:n], []byte("\r\n\r\n")) && n < len(buf) {
			k, err := c.Read(buf[n:])
			if err != nil {
				return
			}
			n += k
		}
		io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
	})
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go io.WriteString(pw, "the start of a body that never ends")
	resp, body := h2Do(t, h2cClient(t), newReq(t, "POST", "http://"+addr(t, m, "web")+"/upload", pr))
	if resp.StatusCode != 413 || body != "too big\n" {
		t.Fatalf("%d %q, want the upstream's early 413", resp.StatusCode, body)
	}
	if got := lstat(m, "downstream_rq_4xx"); got != 1 {
		t.Errorf("downstream_rq_4xx = %d, want 1", got)
	}
}

// TestH2CAccessLog: HTTP/2 requests are logged with PROTOCOL HTTP/2.0.
func TestH2CAccessLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	be, _ := recordingBackend(t)
	cfg := proxyConfig(be, h2cListener, func(l *config.Listener) {
		l.AccessLog = []config.AccessLog{{Path: path, Format: config.AccessLogJSON}}
	})
	m := startManager(t, cfg, 1)
	c := h2cClient(t)
	h2Do(t, c, newReq(t, "GET", "http://"+addr(t, m, "web")+"/logged?x=1", nil))
	m.Close() // writes out the queues
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		PROTOCOL, PATH, METHOD, UPSTREAM_CLUSTER string
		RESPONSE_CODE, BYTES_SENT                int
	}
	if err := json.Unmarshal(bytes.TrimSpace(b), &rec); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if rec.PROTOCOL != "HTTP/2.0" || rec.PATH != "/logged?x=1" || rec.METHOD != "GET" ||
		rec.RESPONSE_CODE != 200 || rec.UPSTREAM_CLUSTER != "backend" || rec.BYTES_SENT != len("GET /logged ") {
		t.Fatalf("access log line %s", b)
	}
}

// TestH2CRetries: the route's retry policy and the stale-connection retry
// apply to HTTP/2 requests as to HTTP/1.1 ones: a 503 goes to the other
// endpoint, a dead endpoint is skipped, a pooled connection the upstream
// closed is replaced.
func TestH2CRetries(t *testing.T) {
	t.Run("5xx", func(t *testing.T) {
		var bad, good atomic.Int64
		cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(1) },
			namedBackend(t, "bad", 503, &bad), namedBackend(t, "good", 200, &good))
		h2cListener(&cfg.Listeners[0])
		m := startManager(t, cfg, 1)
		c := h2cClient(t)
		for i := range 10 {
			resp, body := h2Do(t, c, newReq(t, "GET", "http://"+addr(t, m, "web")+"/", nil))
			if resp.StatusCode != 200 || body != "good" {
				t.Fatalf("request %d: %d %q, want the good endpoint's 200", i, resp.StatusCode, body)
			}
		}
		if bad.Load() == 0 {
			t.Fatal("the failing endpoint got no request: the test proves nothing")
		}
		if n := counter(m, "cluster.backend.upstream_rq_retry"); n != uint64(bad.Load()) {
			t.Errorf("upstream_rq_retry = %d, want %d (one per 503)", n, bad.Load())
		}
	})
	t.Run("connect-failure", func(t *testing.T) {
		cfg := retryConfig(func(r *config.Route) { r.RetryOn = []string{"connect-failure"} },
			deadPort(t), namedBackend(t, "good", 200, nil))
		h2cListener(&cfg.Listeners[0])
		m := startManager(t, cfg, 1)
		c := h2cClient(t)
		for i := range 6 {
			resp, body := h2Do(t, c, newReq(t, "POST", "http://"+addr(t, m, "web")+"/", strings.NewReader("b")))
			if resp.StatusCode != 200 || body != "good" {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}
		if n := counter(m, "cluster.backend.upstream_cx_connect_fail"); n == 0 {
			t.Fatal("no connect failed: the test proves nothing")
		}
	})
	t.Run("stale", func(t *testing.T) {
		var conns atomic.Int64
		be := rawBackend(t, func(c net.Conn) {
			conns.Add(1)
			// One request per connection, without saying so.
			if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
				return
			}
			io.WriteString(c, okResponse)
		})
		m := startManager(t, proxyConfig(be, h2cListener), 1)
		c := h2cClient(t)
		for i := range 5 {
			resp, _ := h2Do(t, c, newReq(t, "GET", "http://"+addr(t, m, "web")+"/", nil))
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
		}
		if conns.Load() < 5 {
			t.Fatalf("%d upstream connections for 5 requests: no stale one was met", conns.Load())
		}
	})
}

// TestH2CUpstreamResetMidResponse: an upstream that fails after the
// response head went out resets the client's stream: the client never
// takes the cut body for a whole one.
func TestH2CUpstreamResetMidResponse(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n0123456789")
		c.(*net.TCPConn).SetLinger(0) // RST
	})
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	resp, err := h2cClient(t).Get("http://" + addr(t, m, "web") + "/reset")
	if err == nil {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("truncated response read without error: %d bytes", len(b))
		}
	}
	if got := counter(m, "cluster.backend.upstream_rq_total"); got != 1 {
		t.Errorf("upstream_rq_total = %d, want 1", got)
	}
}

// TestHTTP1ToH2Upstream: an HTTP/1.1 client's requests to a cluster with
// http2 = true go out as HTTP/2: a GET, a POST with a length, a chunked
// POST, on one keep-alive connection; the upstream's trailer comes back in
// the chunked response.
func TestHTTP1ToH2Upstream(t *testing.T) {
	be, seen := h2cBackend(t)
	cfg := proxyConfig(be)
	cfg.Clusters[0].HTTP2 = true
	m := startManager(t, cfg, 1)
	base := "http://" + addr(t, m, "web")
	c := newClient(t)

	resp, body := get(t, c, base+"/a?b=c", "Host", "h1.example.com")
	if resp.ProtoMajor != 1 || body != "HTTP/2.0 GET /a " || resp.Trailer.Get("X-Upstream-Trailer") != "t1" {
		t.Fatalf("GET: %s %q trailer %v", resp.Proto, body, resp.Trailer)
	}
	if s := <-seen; s.proto != "HTTP/2.0" || s.uri != "/a?b=c" || s.host != "h1.example.com" || s.header.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("backend saw %s %s host %q headers %v", s.proto, s.uri, s.host, s.header)
	}

	for _, body := range []io.Reader{strings.NewReader("sized body"), io.MultiReader(strings.NewReader("chunked "), strings.NewReader("body"))} {
		req := newReq(t, "POST", base+"/p", body)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := <-seen
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "HTTP/2.0 POST /p ") || s.body != strings.TrimPrefix(string(b), "HTTP/2.0 POST /p ") {
			t.Errorf("POST: %d %q, backend body %q", resp.StatusCode, b, s.body)
		}
	}
	if got := lstat(m, statCxTotal); got != 1 {
		t.Errorf("%s = %d, want 1 (keep-alive)", statCxTotal, got)
	}
	if got := counter(m, "cluster.backend.upstream_rq_total"); got != 3 {
		t.Errorf("upstream_rq_total = %d, want 3", got)
	}
	if got := lstat(m, httpfront.StatRqHTTP2); got != 0 {
		t.Errorf("%s = %d for HTTP/1.1 clients", httpfront.StatRqHTTP2, got)
	}

	// Expect: 100-continue: the client gets its 100 before it sends.
	conn, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "POST /expect HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("first line %q, %v: want a 100 Continue", line, err)
	}
	io.WriteString(conn, "data")
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "HTTP/1.1 200 OK") || !strings.Contains(string(rest), "HTTP/2.0 POST /expect data") {
		t.Fatalf("after the 100: %q", rest)
	}
	if s := <-seen; s.body != "data" || s.header.Get("Expect") != "" {
		t.Errorf("backend body %q, Expect %q", s.body, s.header.Get("Expect"))
	}

	// Close ends the upstream HTTP/2 connections, busy or idle.
	m.Close()
	waitFor(t, 5*time.Second, "upstream connections closed", func() bool {
		return gauge(m, "cluster.backend.upstream_cx_active") == 0
	})
}

// TestH2CIdleTimeout: an HTTP/2 connection without a stream for
// idle_timeout gets a GOAWAY and is closed.
func TestH2CIdleTimeout(t *testing.T) {
	cfg := directConfig("ok")
	h2cListener(&cfg.Listeners[0])
	cfg.Listeners[0].IdleTimeout = dur(300 * time.Millisecond)
	m := startManager(t, cfg, 1)
	rc := dialRawH2(t, addr(t, m, "web"))
	start := time.Now()
	goAway := false
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			break // closed
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			goAway = true
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			rc.fr.WriteSettingsAck()
		}
	}
	if !goAway {
		t.Fatal("connection closed without a GOAWAY")
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 10*time.Second {
		t.Fatalf("closed after %v, want about idle_timeout (300ms)", d)
	}
	waitFor(t, 5*time.Second, "the connection counted closed", func() bool { return cxActive(m) == 0 })
}

// TestH2CDrainGoAwayToLateConnection: a connection the drain's GOAWAY
// missed, because it became HTTP/2 only after the drain began (accepted
// before, its preface sent after; a TLS handshake finishing late is the
// same), gets a GOAWAY without a request of its own: with its first
// request, or, as here when none comes, within h2FirstRequestWait; a
// client that opened it and sends nothing yet would otherwise see it
// closed under it, without notice, once idle for drainIdleGrace.
func TestH2CDrainGoAwayToLateConnection(t *testing.T) {
	cfg := directConfig("ok")
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 1)
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitFor(t, 5*time.Second, "the connection accepted", func() bool { return cxActive(m) == 1 })

	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 15 * time.Second}) }()
	// Accepting stops after the drain's GOAWAY went out (drain.go).
	waitFor(t, 5*time.Second, "accepting stopped", m.acceptStopped)

	fr := http2.NewFramer(c, c)
	c.SetDeadline(time.Now().Add(5 * time.Second)) // a GOAWAY comes at once, or never
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended after %v without a GOAWAY: %v", time.Since(start).Round(time.Millisecond), err)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %v, want a graceful one (NO_ERROR)", ga.ErrCode)
			}
			break
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			fr.WriteSettingsAck()
		}
	}
	if d := time.Since(start); d >= drainIdleGrace {
		t.Errorf("the GOAWAY came %v after the preface, want at once (before the drain closes idle connections, %v)", d, drainIdleGrace)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("drain: %v (want it to finish by itself)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("drain did not end")
	}
}
