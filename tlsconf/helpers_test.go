package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// testCA signs the certificates of one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(tb testing.TB) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tlsconf test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// leafPEM makes a server certificate for names with the given serial
// number, valid until notAfter, and its key, both PEM.
func (ca *testCA) leafPEM(tb testing.TB, serial int64, notAfter time.Time, names ...string) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// writePair writes a certificate for names (serial) and its key into dir
// as base.pem and base.key.
func (ca *testCA) writePair(tb testing.TB, dir, base string, serial int64, names ...string) config.CertificatePair {
	tb.Helper()
	c, k := ca.leafPEM(tb, serial, time.Now().Add(24*time.Hour), names...)
	p := config.CertificatePair{Cert: filepath.Join(dir, base+".pem"), Key: filepath.Join(dir, base+".key")}
	writeFile(tb, p.Cert, c)
	writeFile(tb, p.Key, k)
	return p
}

func writeFile(tb testing.TB, path string, b []byte) {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// tlsConfig is a listener's [listeners.tls] with defaults filled.
func tlsConfig(pairs ...config.CertificatePair) *config.ListenerTLS {
	return &config.ListenerTLS{
		Certificates:          pairs,
		MinVersion:            config.TLSVersion12,
		ALPN:                  []string{config.ALPNHTTP11},
		SessionTicketRotation: config.Duration(time.Hour),
		HandshakeTimeout:      config.Duration(10 * time.Second),
	}
}

// buildSet builds a Set of one listener "web", started with a stats store
// of its own, closed at the end of the test.
func buildSet(tb testing.TB, t *config.ListenerTLS) (*Set, *stats.Store) {
	tb.Helper()
	s, err := Build(&config.Config{Listeners: []config.Listener{{Name: "web", TLS: t}}})
	if err != nil {
		tb.Fatal(err)
	}
	st, err := stats.New(stats.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	s.Start(StartOptions{Stats: st})
	tb.Cleanup(func() {
		s.Close()
		st.Close()
	})
	return s, st
}

// serveTLS serves cfg on a loopback port: each connection handshakes,
// gets one byte (after the TLS 1.3 session tickets), and is closed once
// the client closes.
func serveTLS(tb testing.TB, cfg *tls.Config) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	tb.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() != nil {
					return
				}
				tc.Write([]byte("x"))
				io.Copy(io.Discard, tc)
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake connects to addr with cfg, reads the server's byte (so that
// TLS 1.3 tickets reach cfg's session cache) and returns the connection's
// state.
func handshake(tb testing.TB, addr string, cfg *tls.Config) tls.ConnectionState {
	tb.Helper()
	st, err := tryHandshake(addr, cfg)
	if err != nil {
		tb.Fatalf("handshake with %s (SNI %q): %v", addr, cfg.ServerName, err)
	}
	return st
}

func tryHandshake(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return tls.ConnectionState{}, errors.Join(errors.New("reading the server's byte"), err)
	}
	return c.ConnectionState(), nil
}

// servedSerial is the serial number of the certificate the server showed.
func servedSerial(st tls.ConnectionState) int64 { return st.PeerCertificates[0].SerialNumber.Int64() }

// waitFor polls cond every 10ms until it holds or limit passes, and
// returns how long it took and whether it held.
func waitFor(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func counter(st *stats.Store, name string) uint64 {
	return st.Counter("listener.web." + name).Value()
}
