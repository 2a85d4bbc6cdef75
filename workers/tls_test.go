package workers

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/downstream/tcp"
)

func directRoute(body string) config.Route {
	return config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: body}}
}

// tlsDirectConfig is an https listener "web" answering body itself.
func tlsDirectConfig(body string, l ...func(*config.Listener)) *config.Config {
	lst := httpListener("web", directRoute(body))
	withTLS(&lst)
	for _, f := range l {
		f(&lst)
	}
	return &config.Config{Listeners: []config.Listener{lst}}
}

func TestTLSCertificateBySNI(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	a := addr(t, m, "web")
	for _, tc := range []struct{ sni, want string }{
		{"a.example.com", "a.example.com"},
		{"b.example.org", "*.example.org"},
		{"unknown.test", "a.example.com"}, // the default: the first pair
	} {
		cfg := clientTLS(t, tc.sni)
		// Only the certificate shown matters here; the unknown name
		// would fail verification (as it should).
		cfg.InsecureSkipVerify = true
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, cfg)
		if err != nil {
			t.Fatalf("SNI %q: %v", tc.sni, err)
		}
		got := c.ConnectionState().PeerCertificates[0].DNSNames
		c.Close()
		if !slices.Equal(got, []string{tc.want}) {
			t.Errorf("SNI %q: certificate for %v, want [%s]", tc.sni, got, tc.want)
		}
	}
	// The two known names verify against the demo CA: the chain served
	// is complete.
	dialTLS(t, a, "a.example.com")
	dialTLS(t, a, "www.example.org")
	waitFor(t, 5*time.Second, "5 handshakes counted", func() bool { return tlsStat(m, "web", statSSLHandshake) == 5 })
	for stat, want := range map[string]uint64{
		statSSLVersionTLS13: 5, statSSLVersionTLS12: 0, statSSLALPNHTTP11: 5, statSSLALPNH2: 0,
		statSSLConnectionError: 0, statSSLSessionReused: 0,
	} {
		if got := tlsStat(m, "web", stat); got != want {
			t.Errorf("%s = %d, want %d", stat, got, want)
		}
	}
}

func TestTLSVersionAndResumptionStats(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	a := addr(t, m, "web")
	cfg := clientTLS(t, "a.example.com")
	cfg.MaxVersion = tls.VersionTLS12
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	for i, wantResumed := range []bool{false, true} {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cs := c.ConnectionState()
		c.Close()
		if cs.DidResume != wantResumed || cs.Version != tls.VersionTLS12 {
			t.Fatalf("connection %d: resumed %v version %x, want %v TLS 1.2", i, cs.DidResume, cs.Version, wantResumed)
		}
	}
	waitFor(t, 5*time.Second, "2 handshakes counted", func() bool { return tlsStat(m, "web", statSSLHandshake) == 2 })
	if r, v12, v13 := tlsStat(m, "web", statSSLSessionReused), tlsStat(m, "web", statSSLVersionTLS12), tlsStat(m, "web", statSSLVersionTLS13); r != 1 || v12 != 2 || v13 != 0 {
		t.Fatalf("session_reused %d tls1_2 %d tls1_3 %d, want 1 2 0", r, v12, v13)
	}
}

func TestTLSRouteServerName(t *testing.T) {
	cfg := tlsDirectConfig("default", func(l *config.Listener) {
		org := directRoute("org")
		org.ServerName = "*.example.org"
		exact := directRoute("a")
		exact.ServerName = "A.example.com"
		l.Routes = []config.Route{org, exact, directRoute("default")}
	})
	m := startTLSManager(t, cfg, 1)
	a := addr(t, m, "web")
	for _, tc := range []struct{ sni, host, want string }{
		{"b.example.org", "a.example.com", "org"}, // the SNI decides, not Host
		{"a.example.com", "b.example.org", "a"},
		{"example.org", "example.org", "default"}, // the wildcard wants a subdomain
	} {
		cfg := clientTLS(t, tc.sni)
		cfg.InsecureSkipVerify = tc.sni == "example.org" // no certificate names it
		tr := &http.Transport{TLSClientConfig: cfg}
		t.Cleanup(tr.CloseIdleConnections)
		_, body := get(t, &http.Client{Transport: tr, Timeout: 20 * time.Second}, "https://"+a+"/", "Host", tc.host)
		if body != tc.want {
			t.Errorf("SNI %q Host %q: %q, want %q", tc.sni, tc.host, body, tc.want)
		}
	}
}

func TestRouteServerNameNeedsSNI(t *testing.T) {
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Prefix: "/", ServerName: "a.example.com", DirectResponse: &config.DirectResponse{Status: 200, Body: "a"}},
		config.Route{Prefix: "/", ServerName: "*.example.org", DirectResponse: &config.DirectResponse{Status: 200, Body: "org"}},
	)}}
	cfg.SetDefaults()
	// The matching alone: config refuses server_name on a listener
	// without TLS, which is what would give these routes an SNI.
	snap, err := compileSnapshot(cfg, Identity{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	ls := snap.listeners["web"]
	for _, tc := range []struct {
		sni  string
		want int // route index, -1 none
	}{
		{"", -1}, // no TLS, or no SNI: a route with server_name never matches
		{"a.example.com", 0},
		{"A.EXAMPLE.COM", 0},
		{"b.a.example.com", -1},
		{"x.example.org", 1},
		{"example.org", -1},
	} {
		got := -1
		if r := ls.routes.Match("a.example.com", "/", tc.sni, nil); r != nil {
			got = r.Index
		}
		if got != tc.want {
			t.Errorf("SNI %q: route %d, want %d", tc.sni, got, tc.want)
		}
	}
}

// TestTLSKeepAliveProxy: several requests on one TLS connection, proxied,
// with X-Forwarded-Proto: https.
func TestTLSKeepAliveProxy(t *testing.T) {
	be := echoBackend(t)
	cfg := proxyConfig(hostOf(be.URL), withTLS)
	m := startTLSManager(t, cfg, 2)
	c := newTLSClient(t, "a.example.com")
	for i := range 5 {
		resp, body := get(t, c, "https://"+addr(t, m, "web")+"/x")
		if resp.StatusCode != 200 || !strings.Contains(body, "X-Forwarded-Proto: https") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
			t.Fatalf("request %d: not over TLS with ALPN http/1.1: %+v", i, resp.TLS)
		}
	}
	if n := lstat(m, statCxTotal); n != 1 {
		t.Fatalf("downstream_cx_total %d, want 1 (keep-alive)", n)
	}
	if n := lstat(m, statRqTotal); n != 5 {
		t.Fatalf("downstream_rq_total %d, want 5", n)
	}
	if n := tlsStat(m, "web", statSSLHandshake); n != 1 {
		t.Fatalf("ssl.handshake %d, want 1", n)
	}
}

// corkedConn holds what is written while corked and sends it in one write
// at flush: two TLS records in one TCP segment.
type corkedConn struct {
	net.Conn
	corked bool
	buf    []byte
}

func (c *corkedConn) Write(p []byte) (int, error) {
	if c.corked {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *corkedConn) flush() error {
	c.corked = false
	_, err := c.Conn.Write(c.buf)
	c.buf = nil
	return err
}

// TestTLSPipelinedRecords: two requests in two TLS records that reach the
// proxy in one segment. crypto/tls reads both records from the socket and
// hands out the first: the second is in its buffer, not on the socket, so
// an idle wait that peeks at the socket would wait for the idle timeout.
func TestTLSPipelinedRecords(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok", func(l *config.Listener) {
		l.IdleTimeout = dur(time.Minute)
	}), 1)
	raw, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	cc := &corkedConn{Conn: raw}
	c := tls.Client(cc, clientTLS(t, "a.example.com"))
	c.SetDeadline(time.Now().Add(5 * time.Second)) // far below the idle timeout
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	// A first exchange, so that the next requests meet the idle wait.
	io.WriteString(c, "GET /0 HTTP/1.1\r\nHost: a\r\n\r\n")
	readResponses(t, r, 1)
	cc.corked = true
	io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n")
	io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
	if err := cc.flush(); err != nil {
		t.Fatal(err)
	}
	if got := readResponses(t, r, 2); !slices.Equal(got, []string{"ok", "ok"}) {
		t.Fatalf("bodies %q", got)
	}
}

// TestTLSHandshakeTimeout: a client that connects and says nothing is
// closed at handshake_timeout, counted, and its slot freed.
func TestTLSHandshakeTimeout(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok", func(l *config.Listener) {
		l.TLS.HandshakeTimeout = dur(200 * time.Millisecond)
	}), 1)
	c := dialTCP(t, addr(t, m, "web"))
	start := time.Now()
	if n, err := c.Read(make([]byte, 1)); err != io.EOF || n != 0 {
		t.Fatalf("read %d %v, want the proxy's close (EOF)", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v, want about 200ms", d)
	}
	waitFor(t, 5*time.Second, "the connection to be freed", func() bool { return cxActive(m) == 0 })
	if e, h := tlsStat(m, "web", statSSLConnectionError), tlsStat(m, "web", statSSLHandshake); e != 1 || h != 0 {
		t.Fatalf("ssl.connection_error %d ssl.handshake %d, want 1 0", e, h)
	}
}

// TestTLSPlainHTTPClient: plain HTTP to a TLS listener is told so and
// closed, and counted as a failed handshake.
func TestTLSPlainHTTPClient(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	resp := rawRequest(t, addr(t, m, "web"), "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp.StatusCode != 400 {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	waitFor(t, 5*time.Second, "the connection to close", func() bool { return cxActive(m) == 0 })
	if e := tlsStat(m, "web", statSSLConnectionError); e != 1 {
		t.Fatalf("ssl.connection_error %d, want 1", e)
	}
}

// TestTLSDrainClosesIdle: a drain closes an idle TLS keep-alive
// connection like a plaintext one, and finishes without cutting anything.
func TestTLSDrainClosesIdle(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	c := dialTLS(t, addr(t, m, "web"), "a.example.com")
	r := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	readResponses(t, r, 1)
	waitFor(t, 5*time.Second, "the connection to be idle", func() bool {
		n := 0
		m.workers[0].conns.mu.Lock()
		for cl := range m.workers[0].conns.m {
			if cc, ok := cl.(*httpfront.Conn); ok && cc.Idle() {
				n++
			}
		}
		m.workers[0].conns.mu.Unlock()
		return n == 1
	})
	start := time.Now()
	if err := m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 15 * time.Second}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("drain took %v", d)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("the idle TLS connection is still open after the drain")
	}
	if n := cxActive(m); n != 0 {
		t.Fatalf("downstream_cx_active %d after the drain", n)
	}
}

// TestTLSUpgradeTunnel: a 101 upgrade over TLS relays both ways (io.Copy:
// no splice with a TLS side).
func TestTLSUpgradeTunnel(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(c, br)
		c.(*net.TCPConn).CloseWrite()
	})
	m := startTLSManager(t, proxyConfig(be, withTLS), 1)
	c := dialTLS(t, addr(t, m, "web"), "a.example.com")
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "ping over tls")
	if err := c.CloseWrite(); err != nil { // close_notify: the proxy passes the EOF on
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "ping over tls" {
		t.Fatalf("echo %q %v", got, err)
	}
}

// TestTCPTLSTermination: a tcp listener terminates TLS and streams the
// plaintext both ways, half-closes included.
func TestTCPTLSTermination(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
	cfg := tcpConfig(be, 0)
	withTLS(&cfg.Listeners[0])
	m := startTLSManager(t, cfg, 1)
	c := dialTLS(t, addr(t, m, "tcp"), "b.example.org")
	if got := c.ConnectionState().PeerCertificates[0].DNSNames; !slices.Equal(got, []string{"*.example.org"}) {
		t.Fatalf("certificate for %v", got)
	}
	msg := strings.Repeat("plaintext to the upstream. ", 4000) // several records
	go func() {
		io.WriteString(c, msg)
		c.CloseWrite() // close_notify: the upstream gets a FIN
	}()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != msg {
		t.Fatalf("echo: %d bytes (want %d), %v", len(got), len(msg), err)
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
	if h, rx, tx := tlsStat(m, "tcp", statSSLHandshake), lstat(m, statRxBytes), lstat(m, statTxBytes); h != 1 || rx != uint64(len(msg)) || tx != uint64(len(msg)) {
		t.Fatalf("ssl.handshake %d rx %d tx %d, want 1 %d %d", h, rx, tx, len(msg), len(msg))
	}
}

func TestTCPTLSHandshakeFailure(t *testing.T) {
	dialed := make(chan struct{}, 1)
	be := rawBackend(t, func(c net.Conn) { dialed <- struct{}{} })
	cfg := tcpConfig(be, 0)
	withTLS(&cfg.Listeners[0])
	m := startTLSManager(t, cfg, 1)
	c := dialTCP(t, addr(t, m, "tcp"))
	io.WriteString(c, "not a ClientHello at all\r\n\r\n")
	if _, err := io.ReadAll(c); err != nil && !isReset(err) {
		t.Fatalf("read: %v", err)
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
	if e := tlsStat(m, "tcp", statSSLConnectionError); e != 1 {
		t.Fatalf("ssl.connection_error %d, want 1", e)
	}
	select {
	case <-dialed:
		t.Fatal("the upstream was dialed for a failed handshake")
	default:
	}
}

func TestNewRefusesTLSListenerWithoutConfig(t *testing.T) {
	cfg := tlsDirectConfig("ok")
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Options{Concurrency: 1}, snap)
	if err == nil || !strings.Contains(err.Error(), `listener "web"`) || !strings.Contains(err.Error(), "ServerTLS") {
		t.Fatalf("New: %v, want an error naming the listener and ServerTLS", err)
	}
}

// TestTLSOpenSSLClient: openssl s_client gets the certificate its
// -servername names.
func TestTLSOpenSSLClient(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed: the s_client check needs it")
	}
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	a := addr(t, m, "web")
	for _, tc := range []struct{ sni, subject string }{
		{"a.example.com", "CN = a.example.com"},
		{"x.example.org", "CN = *.example.org"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, "openssl", "s_client", "-connect", a, "-servername", tc.sni,
			"-CAfile", demoFile("ca.pem"), "-verify_return_error").CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("openssl s_client -servername %s: %v\n%s", tc.sni, err, out)
		}
		if !strings.Contains(string(out), "subject="+tc.subject) {
			t.Fatalf("openssl s_client -servername %s: no %q in\n%s", tc.sni, "subject="+tc.subject, out)
		}
		if !strings.Contains(string(out), "Verify return code: 0 (ok)") {
			t.Fatalf("openssl s_client -servername %s: chain not verified:\n%s", tc.sni, out)
		}
	}
}

// tlsBackend is a TLS server with its own certificate that greets each
// client with name and then echoes.
func tlsBackend(tb testing.TB, name string, pair config.CertificatePair) string {
	tb.Helper()
	cert, err := config.LoadCertificatePair(pair)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{*cert}}
	return rawBackend(tb, func(c net.Conn) {
		tc := tls.Server(c, cfg)
		tc.SetDeadline(time.Now().Add(20 * time.Second))
		if err := tc.Handshake(); err != nil {
			return
		}
		io.WriteString(tc, name+"\n")
		io.Copy(tc, tc)
		tc.CloseWrite()
	})
}

func passthroughConfig(def string, backends map[string]string) *config.Config {
	pass := tcpListener("pass", def)
	pass.SNIRoutes = []config.SNIRoute{
		{ServerNames: []string{"a.example.com"}, Cluster: "a"},
		{ServerNames: []string{"db.example.net", "*.example.org"}, Cluster: "org"},
	}
	cfg := &config.Config{Listeners: []config.Listener{pass}}
	for name, be := range backends {
		cfg.Clusters = append(cfg.Clusters, cluster(name, be))
	}
	return cfg
}

// TestTLSPassthroughBySNI: the ClientHello's SNI picks the backend, which
// terminates TLS itself: the client sees the backend's certificate (the
// proxy has none on this listener) and its greeting.
func TestTLSPassthroughBySNI(t *testing.T) {
	plain := rawBackend(t, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
	cfg := passthroughConfig("plain", map[string]string{
		"a":     tlsBackend(t, "backend a", demoA),
		"org":   tlsBackend(t, "backend org", demoOrg),
		"plain": plain,
	})
	m := startTLSManager(t, cfg, 2)
	a := addr(t, m, "pass")
	for _, tc := range []struct{ sni, cert, greeting string }{
		{"a.example.com", "a.example.com", "backend a"},
		{"x.example.org", "*.example.org", "backend org"},
		{"A.Example.COM", "a.example.com", "backend a"},
	} {
		c := dialTLS(t, a, tc.sni)
		if got := c.ConnectionState().PeerCertificates[0].DNSNames; !slices.Equal(got, []string{tc.cert}) {
			t.Errorf("SNI %q: certificate for %v, want [%s]", tc.sni, got, tc.cert)
		}
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil || line != tc.greeting+"\n" {
			t.Fatalf("SNI %q: greeting %q %v, want %q", tc.sni, line, err, tc.greeting)
		}
		io.WriteString(c, "through\n")
		if line, err := r.ReadString('\n'); err != nil || line != "through\n" {
			t.Fatalf("SNI %q: echo %q %v", tc.sni, line, err)
		}
		c.Close()
	}
	// Not TLS at all: the default cluster gets every byte, the first
	// ones (read while looking for a ClientHello) included.
	c := dialTCP(t, a)
	io.WriteString(c, "PING not tls\n")
	c.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != "PING not tls\n" {
		t.Fatalf("non-TLS to the default cluster: %q %v", got, err)
	}
	// An unnamed SNI goes to the default cluster too: here a plaintext
	// echo, which sends the ClientHello back — not a ServerHello.
	cfgUnknown := clientTLS(t, "unknown.test")
	if _, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, cfgUnknown); err == nil {
		t.Fatal("an unknown SNI completed a handshake: it should have reached the plaintext default cluster")
	}
	waitFor(t, 5*time.Second, "the sessions to end", func() bool { return cxActive(m) == 0 })
	for name, want := range map[string]uint64{"a": 2, "org": 1, "plain": 2} {
		if n := counter(m, "cluster."+name+".upstream_cx_total"); n != want {
			t.Errorf("cluster %s: upstream_cx_total %d, want %d", name, n, want)
		}
	}
	if n := tlsStat(m, "pass", tcp.StatSNINoRoute); n != 0 {
		t.Errorf("sni.no_route %d, want 0 (a default cluster takes the rest)", n)
	}
}

// TestTLSPassthroughNoRoute: without a default cluster, a connection whose
// SNI no route names, or that is not TLS, is closed and counted.
func TestTLSPassthroughNoRoute(t *testing.T) {
	dialed := make(chan struct{}, 4)
	cfg := passthroughConfig("", map[string]string{
		"a":   rawBackend(t, func(net.Conn) { dialed <- struct{}{} }),
		"org": rawBackend(t, func(net.Conn) { dialed <- struct{}{} }),
	})
	m := startTLSManager(t, cfg, 1)
	a := addr(t, m, "pass")
	if _, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, clientTLS(t, "unknown.test")); err == nil {
		t.Fatal("handshake with an unrouted SNI succeeded")
	}
	c := dialTCP(t, a)
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	if got, _ := io.ReadAll(c); len(got) != 0 {
		t.Fatalf("non-TLS client got %q, want a close", got)
	}
	waitFor(t, 5*time.Second, "both refused", func() bool { return tlsStat(m, "pass", tcp.StatSNINoRoute) == 2 })
	waitFor(t, 5*time.Second, "the connections to close", func() bool { return cxActive(m) == 0 })
	select {
	case <-dialed:
		t.Fatal("an upstream was dialed for a connection no route takes")
	default:
	}
}

// TestTLSRequestBodies: request bodies over TLS, read by the body pump
// while the response comes back (Content-Length and chunked, larger than
// a record and than the read buffer).
func TestTLSRequestBodies(t *testing.T) {
	be := echoBackend(t)
	m := startTLSManager(t, proxyConfig(hostOf(be.URL), withTLS), 1)
	c := newTLSClient(t, "a.example.com")
	body := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	for _, chunked := range []bool{false, true} {
		var r io.Reader = strings.NewReader(body)
		if chunked {
			r = io.MultiReader(r) // hides the length: net/http sends it chunked
		}
		req, err := http.NewRequest("POST", "https://"+addr(t, m, "web")+"/echo-body", r)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(got) != body {
			t.Fatalf("chunked %v: %d, %d bytes back of %d, %v", chunked, resp.StatusCode, len(got), len(body), err)
		}
		if te := resp.Header.Get("X-Got-Transfer-Encoding"); (te == "chunked") != chunked {
			t.Fatalf("chunked %v: the upstream got Transfer-Encoding %q", chunked, te)
		}
	}
}

// TestTLSBadRequest: a malformed request over TLS is answered 400 and the
// connection closed gracefully (close_notify, then FIN): the client reads
// the answer, then EOF.
func TestTLSBadRequest(t *testing.T) {
	m := startTLSManager(t, tlsDirectConfig("ok"), 1)
	c := dialTLS(t, addr(t, m, "web"), "a.example.com")
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("response %v %v, want 400", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after the 400: %v, want EOF (close_notify)", err)
	}
}

// TestTLSNoGoroutineLeak: Close ends every TLS connection's goroutine: an
// idle keep-alive one, one stuck in its handshake, a terminated TCP
// session and a passthrough one.
func TestTLSNoGoroutineLeak(t *testing.T) {
	echo := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	c := newTLSClient(t, "a.example.com")
	runtime.GC()
	before := runtime.NumGoroutine()

	cfg := proxyConfig(echo, withTLS) // the http route is never used
	web := httpListener("direct", directRoute("ok"))
	withTLS(&web)
	term := tcpListener("term", "backend")
	withTLS(&term)
	pass := tcpListener("pass", "backend")
	pass.SNIRoutes = []config.SNIRoute{{ServerNames: []string{"db.example.com"}, Cluster: "backend"}}
	cfg.Listeners = append(cfg.Listeners, web, term, pass)
	m := startTLSManager(t, cfg, 2)

	if resp, _ := get(t, c, "https://"+addr(t, m, "direct")+"/"); resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	stuck := dialTCP(t, addr(t, m, "direct")) // never says hello
	tc := dialTLS(t, addr(t, m, "term"), "a.example.com")
	io.WriteString(tc, "x")
	io.ReadFull(tc, make([]byte, 1))
	p := dialTCP(t, addr(t, m, "pass"))
	io.WriteString(p, "not tls: the default cluster\n")
	io.ReadFull(p, make([]byte, 5))
	waitFor(t, 5*time.Second, "4 connections open", func() bool {
		n := int64(0)
		for _, l := range []string{"direct", "term", "pass"} {
			n += gauge(m, "listener."+l+"."+statCxActive)
		}
		return n == 4
	})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	stuck.Close()
	tc.Close()
	p.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTCPTLSIdleTimeout: a terminated TCP session that goes quiet is
// closed at the listener's idle_timeout, like a spliced one.
func TestTCPTLSIdleTimeout(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	cfg := tcpConfig(be, 300*time.Millisecond)
	withTLS(&cfg.Listeners[0])
	m := startTLSManager(t, cfg, 1)
	c := dialTLS(t, addr(t, m, "tcp"), "a.example.com")
	io.WriteString(c, "x")
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data from an idle session")
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 10*time.Second {
		t.Fatalf("closed after %v, want about the 300ms idle timeout", d)
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
}
