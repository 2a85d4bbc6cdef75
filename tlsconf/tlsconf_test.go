package tlsconf

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// TestSNIChoosesTheCertificate: exact names first, then a wildcard
// covering one label, then the default (the first pair), case
// insensitively; an SNI that names nothing is counted, no SNI is not.
func TestSNIChoosesTheCertificate(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	s, st := buildSet(t, tlsConfig(
		ca.writePair(t, dir, "a", 1, "a.example.com"),
		ca.writePair(t, dir, "wild", 2, "*.example.org"),
		ca.writePair(t, dir, "bc", 3, "b.example.com", "c.example.com"),
		// Named by an earlier pair already: never chosen for it.
		ca.writePair(t, dir, "a2", 4, "a.example.com", "x.example.org"),
	))
	addr := serveTLS(t, s.ServerConfigs()["web"])
	cases := []struct {
		sni    string
		serial int64
		named  bool
	}{
		{"a.example.com", 1, true},
		{"A.Example.COM", 1, true},
		{"x.example.org", 4, true}, // an exact name beats the wildcard
		{"y.example.org", 2, true},
		{"Y.EXAMPLE.org", 2, true},
		{"c.example.com", 3, true},
		{"a.b.example.org", 1, false}, // a wildcard covers one label only
		{"example.org", 1, false},
		{"unknown.test", 1, false},
		{"", 1, true}, // no SNI: the default, not counted
	}
	wantUncounted := uint64(0)
	for _, c := range cases {
		cfg := &tls.Config{ServerName: c.sni, RootCAs: ca.pool, InsecureSkipVerify: true}
		if got := servedSerial(handshake(t, addr, cfg)); got != c.serial {
			t.Errorf("SNI %q: served certificate %d, want %d", c.sni, got, c.serial)
		}
		if !c.named {
			wantUncounted++
		}
	}
	if got := counter(st, StatNoCertificate); got != wantUncounted {
		t.Errorf("%s = %d, want %d", StatNoCertificate, got, wantUncounted)
	}
}

// TestConfigFromListenerTLS: versions, cipher suites and ALPN come from
// the config.
func TestConfigFromListenerTLS(t *testing.T) {
	ca := newTestCA(t)
	lt := tlsConfig(ca.writePair(t, t.TempDir(), "a", 1, "a.example.com"))
	lt.MinVersion = config.TLSVersion12
	lt.CipherSuites = []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}
	lt.ALPN = []string{"h2", "http/1.1"}
	s, _ := buildSet(t, lt)
	cfg := s.ServerConfigs()["web"]
	if cfg.MinVersion != tls.VersionTLS12 || len(cfg.CipherSuites) != 1 || cfg.CipherSuites[0] != tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 {
		t.Errorf("MinVersion %x CipherSuites %x: not from the config", cfg.MinVersion, cfg.CipherSuites)
	}
	addr := serveTLS(t, cfg)
	got := handshake(t, addr, &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool, NextProtos: []string{"h2"}, MaxVersion: tls.VersionTLS12})
	if got.NegotiatedProtocol != "h2" || got.CipherSuite != tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 {
		t.Errorf("ALPN %q, suite %x", got.NegotiatedProtocol, got.CipherSuite)
	}

	lt13 := tlsConfig(lt.Certificates...)
	lt13.MinVersion = config.TLSVersion13
	s13, _ := buildSet(t, lt13)
	addr13 := serveTLS(t, s13.ServerConfigs()["web"])
	if _, err := tryHandshake(addr13, &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool, MaxVersion: tls.VersionTLS12}); err == nil {
		t.Error("a TLS 1.2 client was served by a listener with min_version 1.3")
	}

	lt12 := tlsConfig(lt.Certificates...)
	lt12.MaxVersion = config.TLSVersion12
	s12, _ := buildSet(t, lt12)
	addr12 := serveTLS(t, s12.ServerConfigs()["web"])
	if got := handshake(t, addr12, &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool}); got.Version != tls.VersionTLS12 {
		t.Errorf("a listener with max_version 1.2 negotiated %s with a client offering 1.3", tls.VersionName(got.Version))
	}
}

// TestBuildErrorsNameListenerAndFile: a certificate that does not load
// stops Build with the listener and the file named.
func TestBuildErrorsNameListenerAndFile(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	p := ca.writePair(t, dir, "a", 1, "a.example.com")
	writeFile(t, p.Cert, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"))
	_, err := Build(&config.Config{Listeners: []config.Listener{{Name: "web-tls", TLS: tlsConfig(p)}}})
	if err == nil || !strings.Contains(err.Error(), `listener "web-tls"`) || !strings.Contains(err.Error(), p.Cert) {
		t.Fatalf("Build: %v; want an error naming listener \"web-tls\" and %s", err, p.Cert)
	}

	good := ca.writePair(t, dir, "b", 2, "b.example.com")
	lt := tlsConfig(good)
	lt.SessionTicketKeysFile = filepath.Join(dir, "ticket.keys")
	writeFile(t, lt.SessionTicketKeysFile, []byte("too short\n"))
	_, err = Build(&config.Config{Listeners: []config.Listener{{Name: "web-tls", TLS: lt}}})
	if err == nil || !strings.Contains(err.Error(), lt.SessionTicketKeysFile) {
		t.Fatalf("Build: %v; want an error naming %s", err, lt.SessionTicketKeysFile)
	}
}

// TestExpiryGauge: the gauge shows the seconds left of each certificate.
func TestExpiryGauge(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	c, k := ca.leafPEM(t, 1, time.Now().Add(10*time.Hour), "a.example.com")
	p := config.CertificatePair{Cert: filepath.Join(dir, "a.pem"), Key: filepath.Join(dir, "a.key")}
	writeFile(t, p.Cert, c)
	writeFile(t, p.Key, k)
	s, st := buildSet(t, tlsConfig(p))
	// The gauge is set by the run goroutine as it starts; a reload is
	// answered after that.
	if _, err := s.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := st.Gauge(expiresGaugeName("web", 0), stats.GaugeNewest).Value()
	if want := int64(10 * 3600); got > want || got < want-60 {
		t.Errorf("expires_in_seconds = %d, want about %d", got, want)
	}
}

// replaceFile is how a certificate manager may put a new file in place.
type replaceFile func(tb testing.TB, path string, b []byte)

// renameOver writes a temporary file beside path and renames it over path
// (certbot, cert-manager's atomic writers).
func renameOver(tb testing.TB, path string, b []byte) {
	tb.Helper()
	tmp := path + ".tmp"
	writeFile(tb, tmp, b)
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

// truncateWrite rewrites path in place (cp, a shell redirect).
func truncateWrite(tb testing.TB, path string, b []byte) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

// TestCertificateReplacedOnDisk: a pair replaced on disk is served to new
// handshakes within a second, without Reload: by rename and by rewrite in
// place, watched with inotify and polled.
func TestCertificateReplacedOnDisk(t *testing.T) {
	for _, mode := range []string{"inotify", "poll"} {
		for _, how := range []struct {
			name    string
			replace replaceFile
		}{{"rename", renameOver}, {"truncate-write", truncateWrite}} {
			t.Run(mode+"/"+how.name, func(t *testing.T) {
				pollOnly = mode == "poll"
				defer func() { pollOnly = false }()
				ca := newTestCA(t)
				dir := t.TempDir()
				p := ca.writePair(t, dir, "a", 1, "a.example.com")
				s, st := buildSet(t, tlsConfig(p))
				addr := serveTLS(t, s.ServerConfigs()["web"])
				client := &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool}
				if got := servedSerial(handshake(t, addr, client)); got != 1 {
					t.Fatalf("serial %d served, want 1", got)
				}
				// Let the watch start before the change (run adds the
				// watches first thing; a reload is answered after).
				if _, err := s.Reload(t.Context()); err != nil {
					t.Fatal(err)
				}
				reloads := counter(st, StatCertificateReload)

				c, k := ca.leafPEM(t, 2, time.Now().Add(time.Hour), "a.example.com")
				// The key first, then the certificate: in between, the
				// pair does not match, as with a real manager.
				how.replace(t, p.Key, k)
				how.replace(t, p.Cert, c)
				took, ok := waitFor(3*time.Second, func() bool {
					st, err := tryHandshake(addr, client)
					return err == nil && servedSerial(st) == 2
				})
				if !ok {
					t.Fatalf("the new certificate was not served %v after it was written", took)
				}
				if took > time.Second {
					t.Errorf("the new certificate was served %v after it was written, want within a second", took)
				}
				if got := counter(st, StatCertificateReload); got <= reloads {
					t.Errorf("%s = %d, want more than %d", StatCertificateReload, got, reloads)
				}
			})
		}
	}
}

// TestBrokenReplacementIsRefused: a certificate file that does not parse,
// or a key that does not match, is refused and counted; the old pair goes
// on serving; a good pair afterwards is taken.
func TestBrokenReplacementIsRefused(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	p := ca.writePair(t, dir, "a", 1, "a.example.com")
	s, st := buildSet(t, tlsConfig(p))
	addr := serveTLS(t, s.ServerConfigs()["web"])
	client := &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool}
	if _, err := s.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}

	good, _ := os.ReadFile(p.Cert)
	otherCert, otherKey := ca.leafPEM(t, 3, time.Now().Add(time.Hour), "a.example.com")
	for _, broken := range []struct {
		name string
		cert []byte
	}{
		{"half-written", good[:len(good)/2]},
		{"key mismatch", otherCert},
	} {
		failed := counter(st, StatCertificateReloadFailed)
		renameOver(t, p.Cert, broken.cert)
		if _, ok := waitFor(3*time.Second, func() bool { return counter(st, StatCertificateReloadFailed) > failed }); !ok {
			t.Fatalf("%s: %s did not count the refused file", broken.name, StatCertificateReloadFailed)
		}
		if got := servedSerial(handshake(t, addr, client)); got != 1 {
			t.Errorf("%s: serial %d served, want the old 1", broken.name, got)
		}
		// A forced reload refuses it too, and says why, naming the file.
		res, err := s.Reload(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].Error == "" || !strings.Contains(res[0].Error, p.Cert) {
			t.Errorf("%s: Reload = %+v, want one refusal naming %s", broken.name, res, p.Cert)
		}
	}
	renameOver(t, p.Key, otherKey) // now it matches
	if _, ok := waitFor(3*time.Second, func() bool {
		st, err := tryHandshake(addr, client)
		return err == nil && servedSerial(st) == 3
	}); !ok {
		t.Fatal("the repaired pair was never served")
	}
}

// TestKubernetesSymlinkSwap: a Secret mounted in a pod is a directory
// whose files are symlinks through "..data", itself a symlink to a
// timestamped directory; an update writes a new directory and renames a
// new "..data" over the old one. No event names the certificate file, and
// the new pair is served all the same, within a second.
func TestKubernetesSymlinkSwap(t *testing.T) {
	ca := newTestCA(t)
	mount := t.TempDir()
	version := func(n int64) string {
		dir := filepath.Join(mount, "..2026_12_01_"+strings.Repeat("0", int(n)))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		ca.writePair(t, dir, "tls", n, "a.example.com")
		return filepath.Base(dir)
	}
	first := version(1)
	if err := os.Symlink(first, filepath.Join(mount, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.pem", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(mount, f)); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := buildSet(t, tlsConfig(config.CertificatePair{Cert: filepath.Join(mount, "tls.pem"), Key: filepath.Join(mount, "tls.key")}))
	addr := serveTLS(t, s.ServerConfigs()["web"])
	client := &tls.Config{ServerName: "a.example.com", RootCAs: ca.pool}
	if _, err := s.Reload(t.Context()); err != nil { // the watch is set up
		t.Fatal(err)
	}
	if got := servedSerial(handshake(t, addr, client)); got != 1 {
		t.Fatalf("serial %d served, want 1", got)
	}

	second := version(2)
	tmp := filepath.Join(mount, "..data_tmp")
	if err := os.Symlink(second, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(mount, "..data")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(mount, first))
	took, ok := waitFor(3*time.Second, func() bool {
		st, err := tryHandshake(addr, client)
		return err == nil && servedSerial(st) == 2
	})
	if !ok || took > time.Second {
		t.Fatalf("the swapped pair was served after %v (served at all: %v), want within a second", took, ok)
	}
}
