package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// DemoCerts are copies of the demo certificates of examples/tls in a
// test's own directory, so that a test may replace a file (rotation)
// without touching the repository's.
type DemoCerts struct {
	Dir string
	// CA is the demo CA's certificate, which signed the others.
	CA string
	// A names a.example.com; Wildcard names *.example.org; Client is a
	// client certificate.
	A, Wildcard, Client CertPair
}

// Names the demo certificates hold.
const (
	DemoNameA        = "a.example.com"
	DemoNameWildcard = "*.example.org"
)

// CopyDemoCerts copies examples/tls's certificates and keys into a new
// temporary directory of tb.
func CopyDemoCerts(tb testing.TB) DemoCerts {
	tb.Helper()
	root, err := ModuleRoot()
	if err != nil {
		tb.Fatalf("demo certificates: %v", err)
	}
	src := filepath.Join(root, "examples", "tls")
	dir := tb.TempDir()
	for _, f := range []string{"ca.pem", "a.example.com.pem", "a.example.com.key", "wildcard.example.org.pem", "wildcard.example.org.key", "client.pem", "client.key"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			tb.Fatalf("demo certificates: %v (run examples/tls/make-certs.sh?)", err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			tb.Fatalf("demo certificates: %v", err)
		}
	}
	pair := func(name string) CertPair {
		return CertPair{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+".key")}
	}
	return DemoCerts{Dir: dir, CA: filepath.Join(dir, "ca.pem"), A: pair("a.example.com"), Wildcard: pair("wildcard.example.org"), Client: pair("client")}
}

// ListenerTLS is a [listeners.tls] table serving the copies: a.example.com
// (the default) and *.example.org.
func (d DemoCerts) ListenerTLS() *ListenerTLS {
	return &ListenerTLS{Certificates: []CertPair{d.A, d.Wildcard}}
}

// CA is a certificate authority made for one test, to sign server and
// client certificates with crypto/x509.
type CA struct {
	// File is the CA certificate's PEM file.
	File string
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a CA named cn, its certificate written into a temporary
// directory of tb.
func NewCA(tb testing.TB, cn string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(tb),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("CA %q: %v", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("CA %q: %v", cn, err)
	}
	ca := &CA{Cert: cert, key: key, dir: tb.TempDir()}
	ca.File = filepath.Join(ca.dir, "ca.pem")
	writePEM(tb, ca.File, "CERTIFICATE", der)
	return ca
}

// Pool returns a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issued is a certificate a CA signed: its files and parsed forms.
type Issued struct {
	CertPair
	Leaf *x509.Certificate
	// TLS is the pair loaded for a Go server or client.
	TLS tls.Certificate
}

// Issue signs a server certificate for names (DNS names, or IP addresses)
// with a fresh random serial, and writes it and its key as base.pem and
// base.key into the CA's directory (replacing earlier files of that base).
func (ca *CA) Issue(tb testing.TB, base string, names ...string) Issued {
	tb.Helper()
	return ca.issue(tb, base, x509.ExtKeyUsageServerAuth, nil, names)
}

// Reissue signs a new certificate for prev's names and key, with a fresh
// serial, as base: a rotation in which only the certificate file changes,
// so that one rename replaces it whole.
func (ca *CA) Reissue(tb testing.TB, base string, prev Issued) Issued {
	tb.Helper()
	names := append(append([]string(nil), prev.Leaf.DNSNames...), ipStrings(prev.Leaf.IPAddresses)...)
	return ca.issue(tb, base, x509.ExtKeyUsageServerAuth, prev.TLS.PrivateKey.(*ecdsa.PrivateKey), names)
}

// IssueClient signs a client certificate named cn.
func (ca *CA) IssueClient(tb testing.TB, base, cn string) Issued {
	tb.Helper()
	return ca.issue(tb, base, x509.ExtKeyUsageClientAuth, nil, []string{cn})
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// issue signs a certificate for names with key (nil: a new one).
func (ca *CA) issue(tb testing.TB, base string, usage x509.ExtKeyUsage, key *ecdsa.PrivateKey, names []string) Issued {
	tb.Helper()
	if key == nil {
		key = newKey(tb)
	}
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(tb),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		for _, n := range names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("issue %v: %v", names, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("issue %v: %v", names, err)
	}
	out := Issued{CertPair: CertPair{Cert: filepath.Join(ca.dir, base+".pem"), Key: filepath.Join(ca.dir, base+".key")}}
	writePEM(tb, out.Key, "PRIVATE KEY", keyDER)
	writePEM(tb, out.Cert, "CERTIFICATE", der)
	if out.Leaf, err = x509.ParseCertificate(der); err != nil {
		tb.Fatalf("issue %v: %v", names, err)
	}
	out.TLS = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: out.Leaf}
	return out
}

// PEM returns the certificate's and the key's PEM bytes, for a test that
// installs them elsewhere (ReplaceFile).
func (i Issued) PEM(tb testing.TB) (cert, key []byte) {
	tb.Helper()
	var err error
	if cert, err = os.ReadFile(i.Cert); err != nil {
		tb.Fatal(err)
	}
	if key, err = os.ReadFile(i.Key); err != nil {
		tb.Fatal(err)
	}
	return cert, key
}

// ReplaceFile replaces path with data the way a deployment tool does:
// written to a temporary file in the same directory, then renamed over it,
// so that a reader sees the old file or the new one, never half of one.
func ReplaceFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".replace-*")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		tb.Fatal(err)
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func newSerial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		tb.Fatal(err)
	}
	return n.Add(n, big.NewInt(1)) // never 0
}

func writePEM(tb testing.TB, path, blockType string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o644); err != nil {
		tb.Fatal(err)
	}
}
