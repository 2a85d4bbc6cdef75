//go:build unix

package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// tlsCluster builds a cluster with [clusters.tls] t over endpoints and
// worker 0's view, counting into a fresh stats store.
func tlsCluster(tb testing.TB, t config.ClusterTLS, endpoints ...string) (*WorkerCluster, *stats.Store) {
	tb.Helper()
	spec := config.Cluster{Name: "secure", Endpoints: endpoints, TLS: &t, MaxIdlePerEndpoint: new(4)}
	cfg := config.Config{Clusters: []config.Cluster{spec}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		tb.Fatalf("NewCluster: %v", err)
	}
	st, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		tb.Fatal(err)
	}
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, c.Name, 1))
	tb.Cleanup(wc.CloseIdle)
	return wc, st
}

func counter(st *stats.Store, name string) uint64 {
	return st.Counter("cluster.secure." + name).Value()
}

// roundTrip sends one GET over c and reads the whole response, then
// releases c (to the pool when the response allows); it returns the body.
func roundTrip(c *Conn) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /path HTTP/1.1\r\nHost: secure.example\r\n\r\n"); err != nil {
		c.Discard()
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Discard()
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.Discard()
		return "", err
	}
	c.Release(!resp.Close)
	return string(body), nil
}

// tlsGet is one request through wc: Acquire, or AcquireChecked (every
// pooled connection checked first) when checked.
func tlsGet(tb testing.TB, wc *WorkerCluster, checked bool) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acquire := wc.Acquire
	if checked {
		acquire = wc.AcquireChecked
	}
	c, err := acquire(ctx)
	if err != nil {
		tb.Fatalf("Acquire: %v", err)
	}
	body, err := roundTrip(c)
	if err != nil {
		tb.Fatalf("request: %v", err)
	}
	return body
}

// The endpoint's certificate is verified against the cluster's CA, for
// the endpoint's IP address (an IP SAN), and the handshake is counted.
func TestTLSVerifiedAgainstCA(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	b := newTLSBackend(t, "a", cert, nil)
	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b.addr())
	if got := tlsGet(t, wc, false); got != "a" {
		t.Fatalf("body %q, want a", got)
	}
	if cs := b.lastTLS(t); cs.ServerName != "" {
		t.Errorf("SNI %q sent for an IP endpoint; an IP address is never sent as SNI", cs.ServerName)
	}
	if n := counter(st, "ssl.handshake"); n != 1 {
		t.Errorf("ssl.handshake = %d, want 1", n)
	}
	if n := counter(st, "ssl.connection_error") + counter(st, "upstream_cx_connect_fail"); n != 0 {
		t.Errorf("%d connection errors counted for a good handshake", n)
	}
	// A cluster without TLS has no ssl.* stats at all.
	plain := newWorkerCluster(t, config.Cluster{Name: "plain", Endpoints: []string{closedAddr(t)}}, 0)
	plain.BindStats(NewStats(st, "plain", 1))
	if plain.Stats().ssl != nil {
		t.Error("a cluster without TLS got ssl.* stats")
	}
}

// A certificate from another CA is refused: a failed connect (counted in
// ssl.connection_error and upstream_cx_connect_fail), the next endpoint
// is tried, and with none left the error is a ConnectError that says
// why.
func TestTLSWrongCARefused(t *testing.T) {
	ca, other := newTestCA(t, "test"), newTestCA(t, "other")
	good, _, _ := ca.issue("good", []string{"127.0.0.1"}, false)
	bad, _, _ := other.issue("bad", []string{"127.0.0.1"}, false)
	impostor := newTLSBackend(t, "impostor", bad, nil)
	real := newTLSBackend(t, "real", good, nil)

	// Worker 0's round robin starts at the first endpoint: the
	// impostor, refused, then the real one.
	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, impostor.addr(), real.addr())
	if got := tlsGet(t, wc, false); got != "real" {
		t.Fatalf("body %q, want real", got)
	}
	if impostor.hits.Load() != 0 {
		t.Fatal("a request reached the endpoint whose certificate did not verify")
	}
	if n := counter(st, "ssl.connection_error"); n != 1 {
		t.Errorf("ssl.connection_error = %d, want 1", n)
	}
	if n := counter(st, "upstream_cx_connect_fail"); n != 1 {
		t.Errorf("upstream_cx_connect_fail = %d, want 1", n)
	}
	if n := wc.hostStats[0].connectFail.Load(); n != 1 {
		t.Errorf("endpoint 0's connect failures (outlier detection) = %d, want 1", n)
	}

	alone, st2 := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, impostor.addr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := alone.Acquire(ctx)
	var ce *ConnectError
	var unknownAuthority x509.UnknownAuthorityError
	if !errors.As(err, &ce) || !errors.Is(err, ErrTLSHandshake) || !errors.As(err, &unknownAuthority) {
		t.Fatalf("Acquire: %v, want a ConnectError wrapping ErrTLSHandshake and x509.UnknownAuthorityError", err)
	}
	if !strings.Contains(err.Error(), impostor.addr()) || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("error %q names neither the endpoint nor the reason", err)
	}
	if n := counter(st2, "ssl.connection_error"); n != 1 {
		t.Errorf("ssl.connection_error = %d, want 1", n)
	}
}

// An endpoint given by host name is verified for that name, sent as SNI.
func TestTLSEndpointHostName(t *testing.T) {
	var answer atomic.Value
	answer.Store("127.0.0.1")
	fakeDNS(t, &answer)
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("app.test", []string{"app.test"}, false)
	b := newTLSBackend(t, "a", cert, nil)
	_, port, _ := net.SplitHostPort(b.addr())
	wc, _ := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, net.JoinHostPort("app.test", port))
	if got := tlsGet(t, wc, false); got != "a" {
		t.Fatalf("body %q, want a", got)
	}
	if sni := b.lastTLS(t).ServerName; sni != "app.test" {
		t.Errorf("SNI %q, want app.test", sni)
	}
}

// server_name replaces the endpoint's host: sent as SNI and verified.
func TestTLSServerNameOverride(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend.internal", []string{"backend.internal"}, false)
	b := newTLSBackend(t, "a", cert, nil)

	// Without it, the certificate (no IP SAN) does not name 127.0.0.1.
	wc, _ := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b.addr())
	_, err := wc.Acquire(context.Background())
	var hostErr x509.HostnameError
	if !errors.As(err, &hostErr) {
		t.Fatalf("Acquire without server_name: %v, want an x509.HostnameError", err)
	}

	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut, ServerName: "backend.internal"}, b.addr())
	if got := tlsGet(t, wc, false); got != "a" {
		t.Fatalf("body %q, want a", got)
	}
	if sni := b.lastTLS(t).ServerName; sni != "backend.internal" {
		t.Errorf("SNI %q, want backend.internal", sni)
	}
	if n := counter(st, "ssl.handshake"); n != 1 {
		t.Errorf("ssl.handshake = %d, want 1", n)
	}
}

// A server that requires a client certificate gets the cluster's; a
// cluster without one is refused: at the handshake in TLS 1.2, and in
// TLS 1.3 at the first read (the client's handshake is over before the
// server has checked its certificate).
func TestTLSClientCertificate(t *testing.T) {
	ca := newTestCA(t, "test")
	serverCert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	_, clientPEM, clientKey := ca.issue("hotproxy-client", nil, true)
	requireCert := func(max uint16) func(*tls.Config) {
		return func(c *tls.Config) {
			c.ClientAuth = tls.RequireAndVerifyClientCert
			c.ClientCAs = ca.pool
			c.MaxVersion = max
		}
	}
	b13 := newTLSBackend(t, "b13", serverCert, requireCert(tls.VersionTLS13))
	b12 := newTLSBackend(t, "b12", serverCert, requireCert(tls.VersionTLS12))

	for _, b := range []*tlsBackend{b13, b12} {
		wc, _ := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut, Cert: clientPEM, Key: clientKey}, b.addr())
		if got := tlsGet(t, wc, false); got != b.name {
			t.Fatalf("%s: body %q", b.name, got)
		}
		cs := b.lastTLS(t)
		if len(cs.PeerCertificates) == 0 || cs.PeerCertificates[0].Subject.CommonName != "hotproxy-client" {
			t.Errorf("%s: the backend saw no client certificate from the cluster", b.name)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b12.addr())
	if _, err := wc.Acquire(ctx); !errors.Is(err, ErrTLSHandshake) {
		t.Errorf("TLS 1.2 without a client certificate: Acquire %v, want ErrTLSHandshake", err)
	}
	if n := counter(st, "ssl.connection_error"); n != 1 {
		t.Errorf("ssl.connection_error = %d, want 1", n)
	}

	wc, _ = tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b13.addr())
	c, err := wc.Acquire(ctx)
	if err != nil {
		t.Fatalf("TLS 1.3 without a client certificate: Acquire: %v (the refusal comes after the client's handshake)", err)
	}
	if _, err := roundTrip(c); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("TLS 1.3 without a client certificate: request error %v, want the server's certificate_required alert", err)
	}
	if b13.hits.Load() != 1 {
		t.Errorf("the backend served %d requests, want only the one with a certificate", b13.hits.Load())
	}
}

// N sequential requests over one TLS 1.3 cluster ride one upstream
// connection, whether each reuse is checked (a TLS read that does not
// wait) or not.
func TestTLSPooledConnectionReused(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	b := newTLSBackend(t, "a", cert, func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 })
	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b.addr())
	const n = 20
	for i := range n {
		if got := tlsGet(t, wc, i%2 == 0); got != "a" {
			t.Fatalf("request %d: body %q", i, got)
		}
	}
	if got := b.newConns.Load(); got != 1 {
		t.Errorf("%d upstream connections for %d requests, want 1", got, n)
	}
	if v := b.lastTLS(t).Version; v != tls.VersionTLS13 {
		t.Errorf("TLS version %x, want 1.3", v)
	}
	if h := counter(st, "ssl.handshake"); h != 1 {
		t.Errorf("ssl.handshake = %d, want 1", h)
	}
	if wc.IdleConns() != 1 {
		t.Errorf("%d pooled connections, want 1", wc.IdleConns())
	}
}

// A TLS 1.3 connection pooled right after its handshake has the server's
// NewSessionTicket messages waiting on its socket: the check must not
// take them for a response nobody asked for (a peek at the socket
// would, and would throw every such connection away). A server that asks
// for a client certificate (mutual TLS) sends its tickets only after the
// client's handshake is over, so they are there for sure.
func TestTLSSessionTicketsDoNotMakeAPooledConnectionStale(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	_, clientPEM, clientKey := ca.issue("hotproxy-client", nil, true)
	b := newTLSBackend(t, "a", cert, func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS13
		c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, ca.pool
	})
	wc, _ := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut, Cert: clientPEM, Key: clientKey}, b.addr())
	c, err := wc.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waitReadable(t, c) // the tickets have arrived, unread
	if peerClosed(fdOf(t, c)) == false {
		t.Fatal("nothing waits on the socket after the handshake: the test proves nothing")
	}
	c.Release(true)
	if got := tlsGet(t, wc, true); got != "a" {
		t.Fatalf("body %q", got)
	}
	if got := b.newConns.Load(); got != 1 {
		t.Errorf("%d upstream connections, want 1: the pooled one was taken for stale", got)
	}
}

// fdOf returns c's socket descriptor, for a peek in a test.
func fdOf(tb testing.TB, c *Conn) uintptr {
	tb.Helper()
	var fd uintptr
	if err := c.raw.Control(func(f uintptr) { fd = f }); err != nil {
		tb.Fatal(err)
	}
	return fd
}

// Bytes the upstream sent after a response, which crypto/tls read from
// the socket along with it, are out of the socket's sight: the check
// must still see them and not reuse the connection.
func TestTLSBufferedStrayBytesMakeAConnectionStale(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	sent := make(chan struct{}, 1)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					req.Body.Close()
					// The response, then stray bytes in a record of
					// their own, then the test reads.
					io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
					io.WriteString(conn, "garbage")
					sent <- struct{}{}
				}
			}()
		}
	}()
	wc, _ := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, ln.Addr().String())
	c, err := wc.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("the server sent nothing")
	}
	waitReadable(t, c)
	// Read exactly the response: its record; the stray one comes in
	// with it, into crypto/tls's buffer.
	var buf [64]byte
	got := 0
	for got < len("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na") {
		n, err := c.Read(buf[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if string(buf[:got]) != "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na" {
		t.Fatalf("read %q", buf[:got])
	}
	if peerClosed(fdOf(t, c)) {
		t.Fatal("the stray bytes are still on the socket, not in crypto/tls's buffer: the test proves nothing")
	}
	c.Release(true)
	c2, err := wc.AcquireChecked(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Discard()
	if c2 == c || c2.Reused() {
		t.Error("a connection with stray bytes buffered in crypto/tls was reused")
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections accepted, want 2", n)
	}
}

// A pooled TLS connection the server closed is found when checked (and a
// new one dialed, resuming the session: ssl.session_reused), and when not
// checked the request fails on a Reused connection, which the HTTP path
// retries as for plaintext.
func TestTLSServerClosedPooledConnection(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		b := newTLSBackend(t, "a", cert, func(c *tls.Config) { c.MinVersion, c.MaxVersion = version, version })
		wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, b.addr())
		tlsGet(t, wc, false)
		if b.lastTLS(t).DidResume {
			t.Fatal("the first connection resumed a session")
		}

		closeAndWait := func() {
			t.Helper()
			b.srv.CloseClientConnections()
			wc.pool.mu.Lock()
			c := wc.pool.idle[0][0]
			wc.pool.mu.Unlock()
			waitReadable(t, c) // the close_notify and the FIN are in
		}
		closeAndWait()
		if got := tlsGet(t, wc, true); got != "a" {
			t.Fatalf("%x: body %q", version, got)
		}
		if n := b.newConns.Load(); n != 2 {
			t.Errorf("%x: %d connections, want 2 (the closed one found stale)", version, n)
		}
		if !b.lastTLS(t).DidResume {
			t.Errorf("%x: the new connection did not resume the session", version)
		}
		if n := counter(st, "ssl.session_reused"); n != 1 {
			t.Errorf("%x: ssl.session_reused = %d, want 1", version, n)
		}
		if n := counter(st, "ssl.handshake"); n != 2 {
			t.Errorf("%x: ssl.handshake = %d, want 2", version, n)
		}

		// Unchecked (idle under peekAfterIdle): handed out as it is;
		// the request fails before any response byte on a Reused
		// connection, and a fresh one to the same endpoint serves it.
		closeAndWait()
		c, err := wc.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !c.Reused() {
			t.Fatalf("%x: the pooled connection was checked; the test proves nothing", version)
		}
		if _, err := roundTrip(c); err == nil {
			t.Fatalf("%x: a request on a connection the server closed succeeded", version)
		}
		fresh, err := wc.AcquireFresh(context.Background(), c.EndpointIndex())
		if err != nil {
			t.Fatal(err)
		}
		if body, err := roundTrip(fresh); err != nil || body != "a" {
			t.Fatalf("%x: retry on a fresh connection: %q, %v", version, body, err)
		}
		if n := counter(st, "ssl.session_reused"); n != 2 {
			t.Errorf("%x: ssl.session_reused = %d, want 2", version, n)
		}
	}
}

// The handshake runs within connect_timeout: an endpoint that accepts
// the TCP connection and never answers the ClientHello is a connect
// failure after the timeout, not a request stuck forever.
func TestTLSHandshakeWithinConnectTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	silent := make(chan net.Conn, 8) // accepted, never read
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-silent:
				c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			silent <- c
		}
	}()
	spec := config.Cluster{Name: "secure", Endpoints: []string{ln.Addr().String()}, TLS: &config.ClusterTLS{InsecureSkipVerify: true},
		ConnectTimeout: config.Duration(200 * time.Millisecond)}
	c, err := NewCluster(spec)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := stats.New(stats.Options{Workers: 1})
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, c.Name, 1))
	start := time.Now()
	_, err = wc.Acquire(context.Background())
	elapsed := time.Since(start)
	var ce *ConnectError
	var ne net.Error
	if !errors.As(err, &ce) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Acquire: %v, want a ConnectError for a timeout", err)
	}
	if elapsed > 3*time.Second {
		t.Errorf("the handshake took %v, past the 200ms connect_timeout", elapsed)
	}
	if n := counter(st, "ssl.connection_error"); n != 1 {
		t.Errorf("ssl.connection_error = %d, want 1", n)
	}

	// DialTCP (tcp listeners) too.
	_, _, _, err = wc.DialTCP(context.Background())
	if !errors.As(err, &ce) || !errors.Is(err, ErrTLSHandshake) {
		t.Fatalf("DialTCP: %v, want a ConnectError wrapping ErrTLSHandshake", err)
	}
}

// DialTCP (tcp listeners, CONNECT) to a TLS cluster returns a connection
// whose bytes are encrypted on the wire: the plaintext written to it
// comes out of the server's TLS connection.
func TestTLSDialTCP(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo, decrypted and re-encrypted
	}()
	wc, st := tlsCluster(t, config.ClusterTLS{CA: ca.pemOut}, ln.Addr().String())
	up, _, done, err := wc.DialTCP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	defer up.Close()
	if tc, ok := up.(interface{ TCPConn() *net.TCPConn }); ok && tc.TCPConn() != nil {
		t.Error("a TLS connection offers its socket for splice: the plaintext would bypass TLS")
	}
	up.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(up, "hello"); err != nil {
		t.Fatal(err)
	}
	if cw, ok := up.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
		t.Fatal("no half-close on a TLS connection (tcp listeners forward an EOF)")
	}
	got, err := io.ReadAll(up)
	if err != nil || string(got) != "hello" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	if n := counter(st, "ssl.handshake"); n != 1 {
		t.Errorf("ssl.handshake = %d, want 1", n)
	}
}

// HTTP health checks of a TLS cluster go over TLS, verified; TCP checks
// stay TCP connects.
func TestTLSHealthChecks(t *testing.T) {
	ca, other := newTestCA(t, "test"), newTestCA(t, "other")
	good, _, _ := ca.issue("good", []string{"127.0.0.1"}, false)
	bad, _, _ := other.issue("bad", []string{"127.0.0.1"}, false)
	real := newTLSBackend(t, "real", good, nil)
	impostor := newTLSBackend(t, "impostor", bad, nil)
	for _, path := range []string{"/healthz", ""} {
		c, _, _, _ := newMonitored(t, config.Cluster{
			Endpoints: []string{real.addr(), impostor.addr()},
			TLS:       &config.ClusterTLS{CA: ca.pemOut},
			HealthCheck: &config.HealthCheck{Path: path, Interval: config.Duration(time.Hour),
				Timeout: config.Duration(5 * time.Second)},
		})
		hs := c.state.hosts.Load()
		wantImpostor := path == "" // a TCP connect cannot tell
		if !hs.healthy[0] || hs.healthy[1] != wantImpostor {
			t.Errorf("path %q: healthy %v, want [true %v]", path, hs.healthy, wantImpostor)
		}
	}
	if real.hits.Load() == 0 {
		t.Error("the HTTP check never reached the backend over TLS")
	}
	if impostor.hits.Load() != 0 {
		t.Error("an HTTP check was sent to an endpoint whose certificate did not verify")
	}
}

// Files that cannot be used stop the cluster's build, naming the cluster
// and the file.
func TestTLSConfigErrors(t *testing.T) {
	ca := newTestCA(t, "test")
	_, certFile, keyFile := ca.issue("client", nil, true)
	for _, tc := range []struct {
		tls  config.ClusterTLS
		want []string
	}{
		{config.ClusterTLS{CA: "/nonexistent/ca.pem"}, []string{`cluster "secure"`, "tls.ca", "/nonexistent/ca.pem"}},
		{config.ClusterTLS{CA: keyFile}, []string{`cluster "secure"`, "tls.ca", keyFile, "no PEM certificate"}},
		{config.ClusterTLS{Cert: certFile, Key: "/nonexistent/client.key"}, []string{`cluster "secure"`, "/nonexistent/client.key"}},
	} {
		_, err := NewCluster(config.Cluster{Name: "secure", Endpoints: []string{"127.0.0.1:443"}, TLS: &tc.tls})
		if err == nil {
			t.Errorf("%+v: built", tc.tls)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not say %q", tc.tls, err, w)
			}
		}
	}
	var answer atomic.Value
	answer.Store("127.0.0.1")
	fakeDNS(t, &answer)
	c, err := NewCluster(config.Cluster{Name: "h2", Endpoints: []string{"app.test:443", "127.0.0.1:443"},
		TLS: &config.ClusterTLS{CA: ca.pemOut}, HTTP2: true})
	if err != nil {
		t.Fatal(err)
	}
	if first := c.ClientTLS(0); first.ServerName != "app.test" {
		t.Errorf("ServerName %q for endpoint app.test:443, want app.test", first.ServerName)
	}
	last := c.ClientTLS(len(c.Endpoints) - 1)
	if last.ServerName != "127.0.0.1" || len(last.NextProtos) != 1 || last.NextProtos[0] != "h2" || last.ClientSessionCache == nil {
		t.Errorf("http2 cluster's config: ServerName %q, NextProtos %v, cache %v", last.ServerName, last.NextProtos, last.ClientSessionCache)
	}
	if plain, _ := NewCluster(config.Cluster{Name: "p", Endpoints: []string{"127.0.0.1:80"}}); plain.ClientTLS(0) != nil {
		t.Error("a cluster without TLS has a TLS config")
	}
}
