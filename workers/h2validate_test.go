package workers

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
)

// Issue 20, item 4: the same request gets the same answer over HTTP/1.1
// and HTTP/2, and nothing an HTTP/2 client sends changes the words of the
// request line an HTTP/1.1 upstream receives. The HTTP/2 side is sent
// with a raw Framer and HPACK encoder, so that no client library cleans
// anything up first.

// omit leaves a pseudo-header out of an HTTP/2 request.
const omit = "\x00omit"

// hostileCase is one request, spelt for HTTP/2 (pseudo-headers and
// fields) and, where HTTP/1.1 can say it, for HTTP/1.1.
type hostileCase struct {
	name                            string
	method, scheme, authority, path string
	fields                          []string // more HTTP/2 fields: name, value, ...
	h1                              string   // the same request over HTTP/1.1; "" when it has no HTTP/1.1 spelling
	// status is the answer on both protocols, but where h2Reset says
	// that x/net's server resets the stream (PROTOCOL_ERROR) before any
	// handler runs: RFC 9113 §8.1.1's answer to a malformed request,
	// and over HTTP/1.1 still status.
	status  int
	h2Reset bool
	// line is the request line the backend must get when the request
	// is forwarded (status 200); a refused request reaches it not at all.
	line string
}

func hostileCases() []hostileCase {
	get := func(name, path string, status int, h1Target string) hostileCase {
		return hostileCase{name: name, method: "GET", scheme: "http", authority: "a.example", path: path,
			h1: "GET " + h1Target + " HTTP/1.1\r\nHost: a.example\r\n\r\n", status: status}
	}
	reset := func(c hostileCase) hostileCase { c.h2Reset = true; return c }
	withAuthority := func(c hostileCase, authority string) hostileCase {
		c.authority = authority
		c.h1 = strings.Replace(c.h1, "Host: a.example", "Host: "+authority, 1)
		return c
	}
	return []hostileCase{
		// Forwarded alike, as the baseline.
		{name: "plain GET", method: "GET", scheme: "http", authority: "a.example", path: "/ok?q=1",
			h1: "GET /ok?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 200, line: "GET /ok?q=1 HTTP/1.1"},
		{name: "lower-case method (a token like any other)", method: "get", scheme: "http", authority: "a.example", path: "/ok",
			h1: "get /ok HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 200, line: "get /ok HTTP/1.1"},
		// The request line injection of issue 20: the route matched is
		// "/bad/x", the upstream would read "GET /private/x".
		{name: "spaces in :method", method: "GET /private/x HTTP/1.1", scheme: "http", authority: "a.example", path: "/bad/x",
			h1: "GET /private/x HTTP/1.1 /bad/x HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400},
		{name: "non-token :method", method: "G(T", scheme: "http", authority: "a.example", path: "/",
			h1: "G(T / HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400},
		{name: "space in :path", method: "GET", scheme: "http", authority: "a.example", path: "/bad/x HTTP/1.1",
			h1: "GET /bad/x HTTP/1.1 HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400},
		get("backslash in :path", "/public\\..\\private/x", 400, "/public\\..\\private/x"),
		get("fragment in :path", "/ok#frag", 400, "/ok#frag"),
		get("non-ASCII byte in :path", "/caf\xe9", 400, "/caf\xe9"),
		get("tab in :path", "/a\tb", 400, "/a\tb"), // the HTTP/1.1 parser's 400, as over HTTP/1.1
		reset(get("bad percent-encoding in :path", "/%zz", 400, "/%zz")),
		{name: "bad percent-encoding in the query (passed, as over HTTP/1.1)", method: "GET", scheme: "http", authority: "a.example", path: "/ok?off=10%",
			h1: "GET /ok?off=10% HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 200, line: "GET /ok?off=10% HTTP/1.1"},
		reset(get("CR in :path", "/a\rb", 400, "/a\rb")),
		reset(get("LF in :path", "/a\nb", 400, "/a\nb")),
		reset(get("NUL in :path", "/a\x00b", 400, "/a\x00b")),
		reset(get("relative :path", "bad/x", 400, "bad/x")),
		get("asterisk :path for GET", "*", 400, "*"),
		get(":path longer than a request line may be", "/"+strings.Repeat("a", 8200), 414, "/"+strings.Repeat("a", 8200)),
		{name: ":path as long as a request line may be", method: "GET", scheme: "http", authority: "a.example", path: "/" + strings.Repeat("a", 8192-15),
			h1: "GET /" + strings.Repeat("a", 8192-15) + " HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 200, line: "GET /" + strings.Repeat("a", 8192-15) + " HTTP/1.1"},
		reset(hostileCase{name: "missing :path", method: "GET", scheme: "http", authority: "a.example", path: omit,
			h1: "GET HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400}),
		reset(hostileCase{name: "missing :method", method: omit, scheme: "http", authority: "a.example", path: "/",
			h1: " / HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400}),
		reset(hostileCase{name: ":scheme ftp", method: "GET", scheme: "ftp", authority: "a.example", path: "/",
			h1: "GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", status: 400}),
		reset(hostileCase{name: "DEL in a field value", method: "GET", scheme: "http", authority: "a.example", path: "/",
			fields: []string{"x-a", "a\x7fb"}, h1: "GET / HTTP/1.1\r\nHost: a.example\r\nX-A: a\x7fb\r\n\r\n", status: 400}),
		reset(hostileCase{name: "CR LF in a field value", method: "GET", scheme: "http", authority: "a.example", path: "/",
			fields: []string{"x-a", "a\r\nX-Injected: 1"}, h1: "GET / HTTP/1.1\r\nHost: a.example\r\nX-A: a\rX-Injected: 1\r\n\r\n", status: 400}),
		{name: "HTAB in a field value (allowed, as over HTTP/1.1)", method: "GET", scheme: "http", authority: "a.example", path: "/ok",
			fields: []string{"x-a", "a\tb"}, h1: "GET /ok HTTP/1.1\r\nHost: a.example\r\nX-A: a\tb\r\n\r\n", status: 200, line: "GET /ok HTTP/1.1"},
		reset(hostileCase{name: "upper-case field name", method: "GET", scheme: "http", authority: "a.example", path: "/",
			fields: []string{"X-Upper", "1"}, status: 400}),
		// :authority, and Host beside it.
		withAuthority(get("authority a list", "/", 400, "/"), "a,b"),
		withAuthority(get("authority with a semicolon", "/", 400, "/"), "secret.test;x"),
		withAuthority(get("authority with two trailing dots", "/", 400, "/"), "secret.test.."),
		withAuthority(get("authority with an empty label", "/", 400, "/"), "secret..test"),
		withAuthority(get("authority with a bad port", "/", 400, "/"), "a.example:8x"),
		reset(withAuthority(get("authority with userinfo", "/", 400, "/"), "u@a.example")),
		reset(withAuthority(get("authority with a space", "/", 400, "/"), "a .example")),
		{name: "no authority and no Host", method: "GET", scheme: "http", authority: omit, path: "/",
			h1: "GET / HTTP/1.1\r\n\r\n", status: 400},
		reset(hostileCase{name: "Host disagreeing with :authority", method: "GET", scheme: "http", authority: "a.example", path: "/",
			fields: []string{"host", "b.example"},
			h1:     "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n", status: 400}),
		{name: "Host alone, invalid", method: "GET", scheme: "http", authority: omit, path: "/",
			fields: []string{"host", "a,b"}, h1: "GET / HTTP/1.1\r\nHost: a,b\r\n\r\n", status: 400},
		// Malformed (RFC 9113 §8.2.2): the engine resets the stream.
		reset(hostileCase{name: "connection-specific field", method: "GET", scheme: "http", authority: "a.example", path: "/",
			fields: []string{"connection", "close"}, status: 400}),
	}
}

// hostileConfig routes /private to a 403 of the proxy's own, the host
// secret.test to a 200 of its own, everything else to the backend.
func hostileConfig(backend string, l ...func(*config.Listener)) *config.Config {
	cfg := proxyConfig(backend, l...)
	cfg.Listeners[0].Routes = append([]config.Route{
		{Prefix: "/private", DirectResponse: &config.DirectResponse{Status: 403, Body: "denied"}},
		{Host: "secret.test", Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "secret"}},
	}, cfg.Listeners[0].Routes...)
	return cfg
}

// h2Outcome is what an HTTP/2 stream got: a status, or a reset.
type h2Outcome struct {
	status int
	reset  http2.ErrCode
	isRST  bool
}

// h2Exchange sends one request on stream 1 of a fresh HTTP/2 connection
// over c (preface not yet sent) and reads until its response head or
// its reset.
func h2RawExchange(tb testing.TB, c net.Conn, pseudo [][2]string, fields []string) h2Outcome {
	tb.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		tb.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		tb.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range pseudo {
		if f[1] != omit {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
	}
	for i := 0; i+1 < len(fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		tb.Fatal(err)
	}
	for range 100 {
		f, err := fr.ReadFrame()
		if err != nil {
			tb.Fatalf("reading the answer to stream 1: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				var status int
				for _, hf := range f.PseudoFields() {
					if hf.Name == ":status" {
						for _, d := range hf.Value {
							status = status*10 + int(d-'0')
						}
					}
				}
				return h2Outcome{status: status}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return h2Outcome{isRST: true, reset: f.ErrCode}
			}
		case *http2.GoAwayFrame:
			tb.Fatalf("GOAWAY %v before an answer to stream 1", f.ErrCode)
		}
	}
	tb.Fatal("no answer to stream 1 in 100 frames")
	return h2Outcome{}
}

func (hc hostileCase) pseudo() [][2]string {
	return [][2]string{{":method", hc.method}, {":scheme", hc.scheme}, {":authority", hc.authority}, {":path", hc.path}}
}

// h1RawStatus sends raw on c and reads one response's status.
func h1RawStatus(tb testing.TB, c net.Conn, raw string) int {
	tb.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		tb.Fatalf("reading the answer to %q: %v", raw, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// newRequestLines returns the request lines the capture backend got
// after its first skip bytes.
func newRequestLines(got string, skip int) []string {
	var lines []string
	for _, l := range strings.Split(got[skip:], "\r\n") {
		if strings.Contains(l, " HTTP/1.") && !strings.Contains(l, ": ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// runHostileCases sends every case over HTTP/1.1 (dial1) and HTTP/2
// (dial2) and checks each protocol's answer and what the backend got.
func runHostileCases(t *testing.T, cb *captureBackend, dial1, dial2 func(testing.TB) net.Conn) {
	for _, hc := range hostileCases() {
		t.Run(hc.name, func(t *testing.T) {
			check := func(proto string, send func()) {
				before, _ := cb.received()
				send()
				after, _ := cb.received()
				lines := newRequestLines(after, len(before))
				switch {
				case hc.status == 200 && (len(lines) != 1 || lines[0] != hc.line):
					t.Errorf("%s: the backend got request lines %.300q, want exactly %.300q", proto, lines, hc.line)
				case hc.status != 200 && len(after) != len(before):
					t.Errorf("%s: a refused request reached the backend: %.300q", proto, after[len(before):])
				}
			}
			if hc.h1 != "" {
				check("HTTP/1.1", func() {
					if got := h1RawStatus(t, dial1(t), hc.h1); got != hc.status {
						t.Errorf("HTTP/1.1: status %d, want %d", got, hc.status)
					}
				})
			}
			check("HTTP/2", func() {
				got := h2RawExchange(t, dial2(t), hc.pseudo(), hc.fields)
				switch {
				case hc.h2Reset && (!got.isRST || got.reset != http2.ErrCodeProtocol):
					t.Errorf("HTTP/2: %+v, want the stream reset with PROTOCOL_ERROR by the engine", got)
				case !hc.h2Reset && got.status != hc.status:
					t.Errorf("HTTP/2: %+v, want status %d (as over HTTP/1.1)", got, hc.status)
				}
			})
		})
	}
}

// TestHostileRequestsSameAnswerCleartext: HTTP/1.1 and h2c (prior
// knowledge) on one cleartext listener.
func TestHostileRequestsSameAnswerCleartext(t *testing.T) {
	cb := newCaptureBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	m := startManager(t, hostileConfig(cb.addr, h2cListener), 1)
	a := addr(t, m, "web")
	dial := func(tb testing.TB) net.Conn {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		return c
	}
	runHostileCases(t, cb, dial, dial)
}

// TestHostileRequestsSameAnswerTLS: HTTP/1.1 and HTTP/2 over TLS (ALPN).
func TestHostileRequestsSameAnswerTLS(t *testing.T) {
	cb := newCaptureBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	m := startTLSManagerALPN(t, hostileConfig(cb.addr, withTLS), 1, config.ALPNHTTP2, config.ALPNHTTP11)
	a := addr(t, m, "web")
	dial := func(proto string) func(testing.TB) net.Conn {
		return func(tb testing.TB) net.Conn {
			cfg := clientTLS(tb, "a.example.com")
			cfg.NextProtos = []string{proto}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, cfg)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { c.Close() })
			if got := c.ConnectionState().NegotiatedProtocol; got != proto {
				tb.Fatalf("ALPN %q, want %q", got, proto)
			}
			return c
		}
	}
	runHostileCases(t, cb, dial(config.ALPNHTTP11), dial(config.ALPNHTTP2))
}

// startTLSManagerALPN is startTLSManager with the listeners offering
// protos by ALPN (serverTLSFor offers http/1.1 only).
func startTLSManagerALPN(tb testing.TB, cfg *config.Config, n int, protos ...string) *Manager {
	tb.Helper()
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, n)
	if err != nil {
		tb.Fatalf("BuildSnapshotN: %v", err)
	}
	serverTLS := map[string]*tls.Config{}
	for i := range cfg.Listeners {
		if l := &cfg.Listeners[i]; l.TLS != nil {
			serverTLS[l.Name] = serverTLSFor(tb, l)
			serverTLS[l.Name].NextProtos = protos
		}
	}
	m, err := New(Options{Concurrency: n, Logger: testLogger(), ServerTLS: serverTLS}, snap)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { m.Close() })
	m.Start()
	return m
}

// TestTrailingDotHostRoute: "secret.test." is the absolute form of
// secret.test and takes its route over either protocol; "secret.test.."
// is refused (the table above), never sent to the default route.
func TestTrailingDotHostRoute(t *testing.T) {
	cb := newCaptureBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	m := startManager(t, hostileConfig(cb.addr, h2cListener), 1)
	a := addr(t, m, "web")
	for _, host := range []string{"secret.test.", "SECRET.test.:80"} {
		resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 200 || resp.ContentLength != int64(len("secret")) {
			t.Errorf("HTTP/1.1 Host %q: %d (%d bytes), want the secret.test route's 200", host, resp.StatusCode, resp.ContentLength)
		}
		req := newReq(t, "GET", "http://"+a+"/", nil)
		req.Host = host
		resp2, body2 := h2Do(t, h2cClient(t), req)
		if resp2.StatusCode != 200 || body2 != "secret" {
			t.Errorf("HTTP/2 :authority %q: %d %q, want the secret.test route's 200", host, resp2.StatusCode, body2)
		}
	}
	if got, _ := cb.received(); got != "" {
		t.Errorf("the backend got %q; every request was the secret.test route's", got)
	}
}
