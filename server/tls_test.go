package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/tlsconf"
)

// demoPair copies the demo a.example.com pair (examples/tls) into a
// temporary directory, where a test may replace it.
func demoPair(tb testing.TB) config.CertificatePair {
	tb.Helper()
	dir := tb.TempDir()
	p := config.CertificatePair{Cert: filepath.Join(dir, "a.pem"), Key: filepath.Join(dir, "a.key")}
	for src, dst := range map[string]string{"a.example.com.pem": p.Cert, "a.example.com.key": p.Key} {
		b, err := os.ReadFile(filepath.Join("..", "examples", "tls", src))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return p
}

// startTLSServer runs a generation with one http listener "web-tls" that
// has [listeners.tls] with pair, and returns its admin URL.
func startTLSServer(tb testing.TB, pair config.CertificatePair) string {
	tb.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[server]
concurrency = 1
drain_time = "1s"
parent_shutdown_time = "1s"
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "web-tls"
address = %q
protocol = "http"
  [listeners.tls]
  certificates = [{ cert = %q, key = %q }]
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "hello" }
`, freeAddr(tb), pair.Cert, pair.Key)), "test.toml")
	if err != nil {
		tb.Fatalf("config: %v", err)
	}
	isolateStats(tb, cfg)
	srv, err := New(Options{Config: cfg})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		srv.Run(ctx)
		close(finished)
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			tb.Errorf("Run did not return after cancel")
		}
	})
	adminURL := "http://" + srv.AdminAddr().String()
	waitReady(tb, adminURL)
	return adminURL
}

// TestTLSReloadEndpoint: POST /tls/reload reads the pairs again: 200 with
// each pair when all load, 422 naming the file of one that does not (and
// counted); what a web page could send is refused like every mutation.
func TestTLSReloadEndpoint(t *testing.T) {
	pair := demoPair(t)
	admin := startTLSServer(t, pair)

	code, body := adminRequest{method: "POST", path: "/tls/reload"}.do(t, admin)
	var results []tlsconf.ReloadResult
	if err := json.Unmarshal([]byte(body), &results); err != nil {
		t.Fatalf("POST /tls/reload: %d %s: %v", code, body, err)
	}
	if code != http.StatusOK || len(results) != 1 || results[0].Listener != "web-tls" || results[0].Error != "" || results[0].NotAfter.Year() < 2100 {
		t.Fatalf("POST /tls/reload: %d %+v, want 200 and the one pair reloaded", code, results)
	}
	st := statsJSON(t, admin)
	if st["listener.web-tls.ssl.certificate_reload"] < 1 || st["listener.web-tls.ssl.certificate.0.expires_in_seconds"] < 70*365*86400 {
		t.Errorf("stats after the reload: reload %d, expires_in_seconds %d",
			st["listener.web-tls.ssl.certificate_reload"], st["listener.web-tls.ssl.certificate.0.expires_in_seconds"])
	}

	tmp := pair.Cert + ".new"
	if err := os.WriteFile(tmp, []byte("-----BEGIN CERTIFICATE-----\nhalf"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, pair.Cert); err != nil {
		t.Fatal(err)
	}
	code, body = adminRequest{method: "POST", path: "/tls/reload"}.do(t, admin)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, pair.Cert) {
		t.Fatalf("POST /tls/reload with a broken certificate: %d %s, want 422 naming %s", code, body, pair.Cert)
	}
	if n := statsJSON(t, admin)["listener.web-tls.ssl.certificate_reload_failed"]; n < 1 {
		t.Errorf("ssl.certificate_reload_failed = %d after a refused pair", n)
	}

	code, _ = adminRequest{method: "POST", path: "/tls/reload", headers: map[string]string{"Content-Type": "text/plain"}, body: "x"}.do(t, admin)
	if code != http.StatusForbidden {
		t.Errorf("a text/plain POST /tls/reload (what a web page can send): %d, want 403", code)
	}
}

// keysOnlyParent is the parent side of a hand-over reduced to what the
// keys need: sockets are never asked for here.
type keysOnlyParent struct{}

func (keysOnlyParent) Sockets() ([]hotrestart.Socket, []*os.File, error) { return nil, nil, nil }
func (keysOnlyParent) Drain(hotrestart.Identity, []hotrestart.Socket)    {}
func (keysOnlyParent) ChildLost(hotrestart.Identity, bool, error)        {}

// TestTicketKeysHandedOverThroughTheRestartSocket: the server's glue on
// both ends of a real restart socket: generation B takes A's keys
// (successorHandler.SessionTicketKeys → takeTicketKeys), and a client
// that handshook with A resumes with B, in TLS 1.2 and 1.3. From a parent
// that does not offer them, B keeps its own.
func TestTicketKeysHandedOverThroughTheRestartSocket(t *testing.T) {
	pair := demoPair(t)
	cfg := &config.Config{Listeners: []config.Listener{{Name: "web-tls", TLS: &config.ListenerTLS{
		Certificates: []config.CertificatePair{pair}, MinVersion: "1.2", SessionTicketRotation: config.Duration(time.Hour),
	}}}}
	build := func() *tlsconf.Set {
		s, err := tlsconf.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a := build()
	takeFrom := func(h hotrestart.Handler) *tlsconf.Set {
		t.Helper()
		addr := fmt.Sprintf("@hotproxy-server-test.%d.%d", os.Getpid(), time.Now().UnixNano())
		p, err := hotrestart.Listen(hotrestart.ParentOptions{Address: addr, Handler: h})
		if err != nil {
			t.Fatal(err)
		}
		go p.Serve()
		defer p.Close()
		ch, err := hotrestart.Dial(addr, hotrestart.Identity{Epoch: 1}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		b := build()
		child := &Server{tls: b, log: hclog.NewNullLogger()}
		if err := child.takeTicketKeys(ch); err != nil {
			t.Fatalf("takeTicketKeys: %v", err)
		}
		return b
	}
	// A main loop that is gone: the session's events go nowhere.
	hr := newHandover()
	close(hr.stopped)
	var aNow atomic.Pointer[tlsconf.Set]
	aNow.Store(a)
	b := takeFrom(successorHandler{hr: &hr, tls: &aNow})
	fresh := takeFrom(keysOnlyParent{})
	if got, want := b.TicketKeys()["web-tls"], a.TicketKeys()["web-tls"]; got.Keys[0].Key != want.Keys[0].Key || got.Next.Key != want.Next.Key {
		t.Fatal("generation B's encrypting key, or the one it rotates to next, is not A's")
	}

	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join("..", "examples", "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(caPEM)
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		client := &tls.Config{ServerName: "a.example.com", RootCAs: roots, MinVersion: v, MaxVersion: v,
			ClientSessionCache: tls.NewLRUClientSessionCache(8)}
		control := client.Clone()
		control.ClientSessionCache = tls.NewLRUClientSessionCache(8)
		tlsHandshake(t, a.ServerConfigs()["web-tls"], client)
		tlsHandshake(t, a.ServerConfigs()["web-tls"], control)
		if !tlsHandshake(t, b.ServerConfigs()["web-tls"], client).DidResume {
			t.Errorf("TLS %x: a session from A did not resume on B, which took A's keys", v)
		}
		if tlsHandshake(t, fresh.ServerConfigs()["web-tls"], control).DidResume {
			t.Errorf("TLS %x: resumed on a generation that kept its own keys: the test proves nothing", v)
		}
	}
}

// tlsHandshake runs one handshake of client against a server with
// server's config over loopback, reads a byte (so that TLS 1.3 tickets
// arrive) and returns the client's state.
func tlsHandshake(tb testing.TB, server, client *tls.Config) tls.ConnectionState {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if tc.Handshake() == nil {
			tc.Write([]byte("x"))
			io.Copy(io.Discard, tc)
		}
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err != nil {
		tb.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		tb.Fatalf("reading the server's byte: %v", err)
	}
	return c.ConnectionState()
}
