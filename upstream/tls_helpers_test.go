//go:build unix

package upstream

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testCA is a certificate authority made for one test, its files in a
// t.TempDir.
type testCA struct {
	tb     testing.TB
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pemOut string // the CA certificate's PEM file
	pool   *x509.CertPool
	serial int64
}

func newTestCA(tb testing.TB, name string) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &testCA{tb: tb, dir: tb.TempDir(), cert: cert, key: key, serial: 1, pool: x509.NewCertPool()}
	ca.pool.AddCert(cert)
	ca.pemOut = filepath.Join(ca.dir, name+"-ca.pem")
	writePEM(tb, ca.pemOut, "CERTIFICATE", der)
	return ca
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// issue signs a certificate for names (DNS names, or IP addresses as
// IP SANs), for a server or a client, and returns it with the paths of
// its PEM certificate and key.
func (ca *testCA) issue(cn string, names []string, client bool) (tls.Certificate, string, string) {
	tb := ca.tb
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile := filepath.Join(ca.dir, cn+".pem")
	keyFile := filepath.Join(ca.dir, cn+".key")
	writePEM(tb, certFile, "CERTIFICATE", der)
	writePEM(tb, keyFile, "PRIVATE KEY", keyDER)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		tb.Fatal(err)
	}
	return pair, certFile, keyFile
}

// tlsBackend is a backend (helpers_test.go) that serves HTTPS, and
// records what each request's TLS connection looked like.
type tlsBackend struct {
	*backend
	mu    sync.Mutex // guards seen
	seen  []tls.ConnectionState
	conns sync.Map // net.Conn → struct{}: the connections open now
}

// newTLSBackend starts an HTTPS backend with cert, answering its name;
// cfg, when set, is changed before the server starts (ClientAuth,
// MaxVersion).
func newTLSBackend(tb testing.TB, name string, cert tls.Certificate, cfg func(*tls.Config)) *tlsBackend {
	tb.Helper()
	b := &tlsBackend{backend: &backend{name: name}}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		b.mu.Lock()
		b.seen = append(b.seen, *r.TLS)
		b.mu.Unlock()
		w.Write([]byte(name))
	}))
	b.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			b.newConns.Add(1)
			b.conns.Store(c, struct{}{})
		case http.StateClosed, http.StateHijacked:
			b.conns.Delete(c)
		}
	}
	// Refused handshakes are what some tests are about, not noise.
	b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg != nil {
		cfg(b.srv.TLS)
	}
	b.srv.StartTLS()
	tb.Cleanup(b.srv.Close)
	return b
}

// lastTLS is the TLS state of the last request served.
func (b *tlsBackend) lastTLS(tb testing.TB) tls.ConnectionState {
	tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) == 0 {
		tb.Fatal("the backend served no request")
	}
	return b.seen[len(b.seen)-1]
}

// waitReadable waits until c's socket has something to read (bytes, or
// the peer's FIN), for at most 5s: a readiness wait, not a sleep.
func waitReadable(tb testing.TB, c *Conn) {
	tb.Helper()
	var ready bool
	var perr error
	err := c.raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			n, err := unix.Poll(fds, int(time.Until(deadline)/time.Millisecond)+1)
			if err == unix.EINTR {
				continue
			}
			ready, perr = n > 0, err
			return
		}
	})
	if err != nil || perr != nil || !ready {
		tb.Fatalf("upstream connection not readable within 5s (control %v, poll %v)", err, perr)
	}
}
