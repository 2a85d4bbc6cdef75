package workers

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// The demo certificates of examples/tls: a.example.com, *.example.org, and
// the CA that signed them.
var (
	demoA   = config.CertificatePair{Cert: demoFile("a.example.com.pem"), Key: demoFile("a.example.com.key")}
	demoOrg = config.CertificatePair{Cert: demoFile("wildcard.example.org.pem"), Key: demoFile("wildcard.example.org.key")}
)

func demoFile(name string) string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "examples", "tls", name)
}

// demoCAPool trusts the demo CA.
func demoCAPool(tb testing.TB) *x509.CertPool {
	tb.Helper()
	pool, err := config.LoadCAPool(demoFile("ca.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	return pool
}

// withTLS gives a listener [listeners.tls] with the demo certificates
// (a.example.com first: the default).
func withTLS(l *config.Listener) {
	l.TLS = &config.ListenerTLS{Certificates: []config.CertificatePair{demoA, demoOrg}}
}

// serverTLSFor is what package tlsconf builds, reduced to what the
// workers need: the listener's certificates, crypto/tls picking by SNI
// (the first is the default), and ALPN http/1.1 only (h2 is another
// engineer's).
func serverTLSFor(tb testing.TB, l *config.Listener) *tls.Config {
	tb.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{config.ALPNHTTP11}}
	if l.Protocol == config.ProtocolTCP {
		cfg.NextProtos = nil
	}
	for _, p := range l.TLS.Certificates {
		c, err := config.LoadCertificatePair(p)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Certificates = append(cfg.Certificates, *c)
	}
	return cfg
}

// startTLSManager is startManager with a server TLS config for every
// listener with [listeners.tls].
func startTLSManager(tb testing.TB, cfg *config.Config, n int) *Manager {
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

// clientTLS trusts the demo CA and offers only http/1.1.
func clientTLS(tb testing.TB, serverName string) *tls.Config {
	return &tls.Config{ServerName: serverName, RootCAs: demoCAPool(tb), NextProtos: []string{config.ALPNHTTP11}}
}

// dialTLS completes a handshake with addr, naming serverName.
func dialTLS(tb testing.TB, addr, serverName string) *tls.Conn {
	tb.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, clientTLS(tb, serverName))
	if err != nil {
		tb.Fatalf("TLS dial %s (SNI %q): %v", addr, serverName, err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// newTLSClient is a keep-alive HTTPS client that sends serverName as SNI.
func newTLSClient(tb testing.TB, serverName string) *http.Client {
	tr := &http.Transport{TLSClientConfig: clientTLS(tb, serverName), MaxIdleConnsPerHost: 16}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// readResponses reads n responses (and their bodies) from r.
func readResponses(tb testing.TB, r *bufio.Reader, n int) []string {
	tb.Helper()
	var bodies []string
	for i := range n {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			tb.Fatalf("response %d of %d: %v", i+1, n, err)
		}
		b := make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			tb.Fatalf("response %d body: %v", i+1, err)
		}
		resp.Body.Close()
		bodies = append(bodies, string(b))
	}
	return bodies
}

// tlsStat is the counter listener.<listener>.<stat>.
func tlsStat(m *Manager, listener, stat string) uint64 {
	return counter(m, "listener."+listener+"."+stat)
}
