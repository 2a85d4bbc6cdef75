package harness

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"
)

// StartTLSBackend starts an HTTPBackend (same endpoints, answering as id)
// that speaks HTTPS with cfg: an upstream for [clusters.tls], or the
// destination of a TLS passthrough listener. HTTP/1.1 only unless
// cfg.NextProtos offers h2. It is closed when the test ends.
func StartTLSBackend(tb testing.TB, id string, cfg *tls.Config) *HTTPBackend {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("tls backend %q: %v", id, err)
	}
	b := &HTTPBackend{ID: id, Addr: ln.Addr().String()}
	b.srv = &http.Server{
		Handler:           b,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         cfg.Clone(),
		// Failed handshakes are what some tests provoke (a client with
		// the wrong CA); they are asserted on the client's side.
		ErrorLog: log.New(io.Discard, "", 0),
		// An empty map keeps net/http from adding h2 by itself.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go b.srv.ServeTLS(ln, "", "")
	tb.Cleanup(func() { b.srv.Close() })
	return b
}

// HTTPSURL returns "https://ADDR" for the listener named name, followed by
// path.
func (p *Proxy) HTTPSURL(name, path string) string {
	p.tb.Helper()
	return "https://" + p.Addr(name) + path
}
