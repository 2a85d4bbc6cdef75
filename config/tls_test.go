package config

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The demo certificates, relative to this package's directory (where go
// test runs, and so where a source without a directory resolves from).
const (
	certA    = "../examples/tls/a.example.com.pem"
	keyA     = "../examples/tls/a.example.com.key"
	keyOrg   = "../examples/tls/wildcard.example.org.key"
	demoCA   = "../examples/tls/ca.pem"
	demoKeys = "../examples/tls/ticket.keys"
)

func tlsTable(extra string) string {
	return "[listeners.tls]\ncertificates = [{ cert = \"" + certA + "\", key = \"" + keyA + "\" }]\n" + extra
}

// TestTLSConfigProblems: every TLS key's mistakes are refused with a
// message that names the key and what is wrong.
func TestTLSConfigProblems(t *testing.T) {
	tcp := func(body string) string {
		return listener("address = \"127.0.0.1:5443\"\nprotocol = \"tcp\"\n"+body) + clusterC
	}
	cases := []struct {
		name, data string
		want       []string
	}{
		{"missing cert file", webOK + "[listeners.tls]\ncertificates = [{ cert = \"/nonexistent/a.pem\", key = \"" + keyA + "\" }]\n" + clusterC,
			[]string{`tls.certificates[0]: cert /nonexistent/a.pem`, "no such file"}},
		{"key of another certificate", webOK + "[listeners.tls]\ncertificates = [{ cert = \"" + certA + "\", key = \"" + keyOrg + "\" }]\n" + clusterC,
			[]string{"tls.certificates[0]", "private key does not match public key"}},
		{"no certificates", webOK + "[listeners.tls]\nmin_version = \"1.2\"\n" + clusterC,
			[]string{"tls.certificates: missing"}},
		{"cert without key", webOK + "[listeners.tls]\ncertificates = [{ cert = \"" + certA + "\" }]\n" + clusterC,
			[]string{"tls.certificates[0].key: missing"}},
		{"old version", webOK + tlsTable("min_version = \"1.1\"\n") + clusterC,
			[]string{`tls.min_version: "1.1": use "1.2" or "1.3"`}},
		{"unknown cipher", webOK + tlsTable("cipher_suites = [\"TLS_NOPE\"]\n") + clusterC,
			[]string{`tls.cipher_suites[0]: "TLS_NOPE": unknown TLS 1.2 cipher suite`}},
		{"insecure cipher", webOK + tlsTable("cipher_suites = [\"TLS_RSA_WITH_RC4_128_SHA\"]\n") + clusterC,
			[]string{"insecure cipher suite"}},
		{"max below min", webOK + tlsTable("min_version = \"1.3\"\nmax_version = \"1.2\"\n") + clusterC,
			[]string{`tls.max_version: "1.2" is below min_version "1.3"`}},
		{"unknown max", webOK + tlsTable("max_version = \"1.4\"\n") + clusterC,
			[]string{`tls.max_version: "1.4": use "1.2" or "1.3"`}},
		{"ciphers with 1.3", webOK + tlsTable("min_version = \"1.3\"\ncipher_suites = [\"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\"]\n") + clusterC,
			[]string{`tls.cipher_suites: applies to TLS 1.2, and min_version is "1.3"`}},
		{"alpn h3 on http", webOK + tlsTable("alpn = [\"h3\"]\n") + clusterC,
			[]string{`tls.alpn[0]: "h3": an http listener speaks "h2" or "http/1.1"`}},
		{"empty alpn on http", webOK + tlsTable("alpn = []\n") + clusterC,
			[]string{"tls.alpn: empty"}},
		{"alpn twice", webOK + tlsTable("alpn = [\"h2\", \"h2\"]\n") + clusterC,
			[]string{`tls.alpn[1]: "h2": listed twice`}},
		{"bad keys file", webOK + tlsTable("session_ticket_keys_file = \""+certA+"\"\n") + clusterC,
			[]string{"session_ticket_keys_file", "line 1: not a key"}},
		{"rotation too short", webOK + tlsTable("session_ticket_rotation = \"1s\"\n") + clusterC,
			[]string{"session_ticket_rotation", "must be between 1m and"}},
		{"tls and h2c", listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\nhttp2_cleartext = true\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n"+tlsTable("")) + clusterC,
			[]string{"remove http2_cleartext"}},
		{"tls and park_idle_connections", listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\npark_idle_connections = true\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n"+tlsTable("")) + clusterC,
			[]string{`park_idle_connections: applies to connections without TLS`}},
		{"h2c on tcp", tcp("cluster = \"c\"\nhttp2_cleartext = true"),
			[]string{"http2_cleartext: applies only to http listeners"}},
		{"server_name without tls", httpWith(`{ prefix = "/", server_name = "a.example.com", cluster = "c" }`),
			[]string{`server_name: "a.example.com": matches the SNI of TLS connections, and this listener has no [listeners.tls]`}},
		{"server_name with a port", listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/\", server_name = \"a.example.com:443\", cluster = \"c\" }]\n"+tlsTable("")) + clusterC,
			[]string{"an SNI name has no port"}},
		{"tls and passthrough", tcp("cluster = \"c\"\nsni_routes = [{ server_names = [\"a.example.com\"], cluster = \"c\" }]\n" + tlsTable("")),
			[]string{"a listener does one or the other"}},
		{"passthrough on http", webOK + "sni_routes = [{ server_names = [\"a.example.com\"], cluster = \"c\" }]\n" + clusterC,
			[]string{"sni_routes: TLS passthrough is for tcp listeners"}},
		{"passthrough names", tcp("sni_routes = [{ server_names = [], cluster = \"c\" }, { server_names = [\"10.0.0.1\", \"a.*.com\"], cluster = \"nope\" }]"),
			[]string{"sni_routes[0].server_names: missing", `sni_routes[1].server_names[0]: "10.0.0.1": not a hostname (SNI never holds an IP address)`,
				`sni_routes[1].server_names[1]: "a.*.com"`, `sni_routes[1].cluster: "nope"`}},
		{"passthrough name twice", tcp("sni_routes = [{ server_names = [\"a.example.com\"], cluster = \"c\" }, { server_names = [\"A.example.com\"], cluster = \"c\" }]"),
			[]string{"the first route would always win"}},
		{"tcp without cluster or routes", tcp(""),
			[]string{"cluster: missing: a tcp listener needs the cluster its connections go to (or sni_routes)"}},
		{"cluster ca not PEM", webOK + clusterC + "[clusters.tls]\nca = \"" + keyA + "\"\n",
			[]string{"clusters[0] (\"c\").tls.ca", "no PEM certificate in it"}},
		{"cluster ca missing", webOK + clusterC + "[clusters.tls]\nca = \"/nonexistent/ca.pem\"\n",
			[]string{"clusters[0] (\"c\").tls.ca: open /nonexistent/ca.pem"}},
		{"client cert without key", webOK + clusterC + "[clusters.tls]\ncert = \"" + certA + "\"\n",
			[]string{"a client certificate needs both cert and key"}},
		{"wildcard upstream name", webOK + clusterC + "[clusters.tls]\nserver_name = \"*.example.com\"\n",
			[]string{"a wildcard cannot be sent as SNI"}},
		{"cluster old version", webOK + clusterC + "[clusters.tls]\nmin_version = \"1.0\"\n",
			[]string{`tls.min_version: "1.0"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data), "t.toml")
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.data)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestTLSDefaults(t *testing.T) {
	data := webOK + tlsTable("") +
		"[[listeners]]\nname = \"t\"\naddress = \"127.0.0.1:5443\"\nprotocol = \"tcp\"\ncluster = \"c\"\n" + tlsTable("") +
		clusterC + "[clusters.tls]\n"
	c := mustParse(t, data, "t.toml")
	web, tcp := c.Listeners[0].TLS, c.Listeners[1].TLS
	if !slices.Equal(web.ALPN, DefaultHTTPALPN) || tcp.ALPN != nil {
		t.Errorf("alpn: http %q (want %q), tcp %q (want none)", web.ALPN, DefaultHTTPALPN, tcp.ALPN)
	}
	for _, l := range []*ListenerTLS{web, tcp} {
		if l.MinVersion != DefaultTLSMinVersion || l.MaxVersion != DefaultTLSMaxVersion || l.SessionTicketRotation.D() != DefaultSessionTicketRotation ||
			l.HandshakeTimeout.D() != DefaultHandshakeTimeout {
			t.Errorf("defaults not filled: %+v", l)
		}
	}
	if v := c.Clusters[0].TLS.MinVersion; v != DefaultTLSMinVersion {
		t.Errorf("cluster tls min_version %q, want %q", v, DefaultTLSMinVersion)
	}
	if TLSVersion(web.MinVersion) == 0 || TLSVersion("1.1") != 0 {
		t.Error("TLSVersion maps the wrong versions")
	}
}

// TestTLSFilesRelativeToTheConfig: a relative certificate path is the
// config file's directory's, whatever the working directory, and
// becomes absolute (a later generation may run elsewhere).
func TestTLSFilesRelativeToTheConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certA, keyA, demoCA, demoKeys} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "certs", filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := webOK + "[listeners.tls]\ncertificates = [{ cert = \"certs/a.example.com.pem\", key = \"certs/a.example.com.key\" }]\n" +
		"session_ticket_keys_file = \"certs/ticket.keys\"\n" + clusterC + "[clusters.tls]\nca = \"certs/ca.pem\"\n"
	path := filepath.Join(dir, "hotproxy.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // somewhere the relative paths do not exist
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	lt := c.Listeners[0].TLS
	if want := filepath.Join(dir, "certs", "a.example.com.pem"); lt.Certificates[0].Cert != want {
		t.Errorf("cert %q, want %q", lt.Certificates[0].Cert, want)
	}
	if !filepath.IsAbs(lt.SessionTicketKeysFile) || !filepath.IsAbs(c.Clusters[0].TLS.CA) {
		t.Errorf("paths not made absolute: %q, %q", lt.SessionTicketKeysFile, c.Clusters[0].TLS.CA)
	}
}

func TestParseSessionTicketKeys(t *testing.T) {
	const k1 = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // "0123456789abcdef0123456789abcdef"
	const k2 = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
	keys, err := ParseSessionTicketKeys([]byte("# fleet keys\n\n" + k1 + "\n  " + k2 + "  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || string(keys[0][:]) != "0123456789abcdef0123456789abcdef" {
		t.Errorf("keys %q", keys)
	}
	for _, bad := range []string{"", "# only a comment\n", "c2hvcnQ=\n", k1 + "\nnot base64!\n"} {
		if _, err := ParseSessionTicketKeys([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseSessionTicketKeys([]byte(k1 + "\nc2hvcnQ=\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("error %v does not name line 2", err)
	}
}

// TestExampleCertificatesLast: the demo certificates are valid for years
// (make-certs.sh gives them a century), so the example never rots.
func TestExampleCertificatesLast(t *testing.T) {
	c, err := LoadCertificatePair(CertificatePair{Cert: certA, Key: keyA})
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(c.Leaf.NotAfter); left < 10*365*24*time.Hour {
		t.Errorf("examples/tls/a.example.com.pem expires in %v: run examples/tls/make-certs.sh", left)
	}
}

// TestParkIdleConnectionsDefault: an http listener without TLS parks idle
// connections unless told not to; one with TLS never does, and gets no
// default (true is refused there: TestTLSConfigProblems; false is
// allowed, it says what happens anyway).
func TestParkIdleConnectionsDefault(t *testing.T) {
	plainTLS := listener("address = \"127.0.0.1:8443\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n" + tlsTable(""))
	offTLS := listener("address = \"127.0.0.1:8443\"\nprotocol = \"http\"\npark_idle_connections = false\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n" + tlsTable(""))
	for _, tc := range []struct {
		name, data string
		field      *bool // the key as loaded (defaults applied)
		parks      bool
	}{
		{"plaintext, left out", webOK + clusterC, ptr(true), true},
		{"plaintext, false", listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\npark_idle_connections = false\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n") + clusterC, ptr(false), false},
		{"tls, left out", plainTLS + clusterC, nil, false},
		{"tls, false", offTLS + clusterC, ptr(false), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.data), "t.toml")
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			l := c.Listeners[0]
			if (l.ParkIdleConnections == nil) != (tc.field == nil) || (l.ParkIdleConnections != nil && *l.ParkIdleConnections != *tc.field) {
				t.Errorf("park_idle_connections loaded as %v, want %v", fmtBoolPtr(l.ParkIdleConnections), fmtBoolPtr(tc.field))
			}
			if got := l.ParksIdleConnections(); got != tc.parks {
				t.Errorf("ParksIdleConnections() = %v, want %v", got, tc.parks)
			}
		})
	}
}

func fmtBoolPtr(b *bool) string {
	if b == nil {
		return "left out"
	}
	return strconv.FormatBool(*b)
}
