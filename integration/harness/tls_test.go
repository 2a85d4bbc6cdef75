package harness

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// TestTLSConfigParses: the TLS tables the harness writes are what the
// product's config accepts, field for field.
func TestTLSConfigParses(t *testing.T) {
	demo := CopyDemoCerts(t)
	ca := NewCA(t, "harness test CA")
	cl := ca.IssueClient(t, "client", "proxy")
	lt := demo.ListenerTLS()
	lt.MinVersion = "1.3"
	lt.ALPN = []string{"http/1.1"}
	lt.SessionTicketRotation = "10m"
	c := Config{
		Listeners: []Listener{
			{Name: "web", TLS: lt, Routes: []Route{{ServerName: "*.example.org", Prefix: "/", Status: 200, Body: "org"}, {Prefix: "/", Cluster: "up"}}},
			{Name: "pass", Protocol: "tcp", SNIRoutes: []SNIRoute{{ServerNames: []string{"a.example.com"}, Cluster: "up"}, {ServerNames: []string{"b.example.com", "*.example.net"}, Cluster: "up2"}}},
		},
		Clusters: []Cluster{
			{Name: "up", Endpoints: []string{"127.0.0.1:1"}, TLS: &ClusterTLS{CA: ca.File, ServerName: "backend.internal", Cert: cl.Cert, Key: cl.Key, MinVersion: "1.2"}},
			{Name: "up2", Endpoints: []string{"127.0.0.1:2"}, TLS: &ClusterTLS{InsecureSkipVerify: true}},
		},
	}.Allocate(t)
	text := c.TOML()
	parsed, err := config.Parse([]byte(text), "/nonexistent/hotproxy.toml")
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	web, pass := parsed.Listeners[0], parsed.Listeners[1]
	if web.TLS == nil || len(web.TLS.Certificates) != 2 || web.TLS.Certificates[0].Cert != demo.A.Cert || web.TLS.Certificates[1].Key != demo.Wildcard.Key ||
		web.TLS.MinVersion != "1.3" || !slices.Equal(web.TLS.ALPN, []string{"http/1.1"}) || time.Duration(web.TLS.SessionTicketRotation) != 10*time.Minute {
		t.Errorf("listeners.tls: %+v\n%s", web.TLS, text)
	}
	if web.Routes[0].ServerName != "*.example.org" {
		t.Errorf("routes[0].server_name: %q", web.Routes[0].ServerName)
	}
	if len(pass.SNIRoutes) != 2 || !slices.Equal(pass.SNIRoutes[1].ServerNames, []string{"b.example.com", "*.example.net"}) || pass.SNIRoutes[1].Cluster != "up2" {
		t.Errorf("sni_routes: %+v", pass.SNIRoutes)
	}
	up := parsed.Clusters[0].TLS
	if up == nil || up.CA != ca.File || up.ServerName != "backend.internal" || up.Cert != cl.Cert || up.Key != cl.Key || up.InsecureSkipVerify {
		t.Errorf("clusters.tls: %+v", up)
	}
	if up2 := parsed.Clusters[1].TLS; up2 == nil || !up2.InsecureSkipVerify {
		t.Errorf("clusters[1].tls: %+v", up2)
	}
}

// TestCAIssueAndTLSBackend: a certificate the test CA issued verifies
// against it for its name only, a second issue has another serial, and
// the TLS backend serves with it.
func TestCAIssueAndTLSBackend(t *testing.T) {
	ca := NewCA(t, "harness test CA")
	first := ca.Issue(t, "server", "backend.internal", "127.0.0.1")
	second := ca.Issue(t, "server", "backend.internal")
	if first.Leaf.SerialNumber.Cmp(second.Leaf.SerialNumber) == 0 {
		t.Error("two issues share a serial")
	}
	if _, err := config.LoadCertificatePair(config.CertificatePair{Cert: second.Cert, Key: second.Key}); err != nil {
		t.Errorf("the written pair does not load: %v", err)
	}
	third := ca.Reissue(t, "rotated", second)
	if third.Leaf.SerialNumber.Cmp(second.Leaf.SerialNumber) == 0 || !slices.Equal(third.Leaf.DNSNames, second.Leaf.DNSNames) {
		t.Errorf("reissue: serial %v names %v, after serial %v names %v", third.Leaf.SerialNumber, third.Leaf.DNSNames, second.Leaf.SerialNumber, second.Leaf.DNSNames)
	}
	// The reissued certificate goes with the earlier key file.
	if _, err := config.LoadCertificatePair(config.CertificatePair{Cert: third.Cert, Key: second.Key}); err != nil {
		t.Errorf("the reissued certificate does not match the earlier key: %v", err)
	}
	b := StartTLSBackend(t, "tb", &tls.Config{Certificates: []tls.Certificate{first.TLS}})
	get := func(name string, pool *x509.CertPool) (string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil,
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name}}}
		resp, err := c.Get("https://" + b.Addr + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	if body, err := get("backend.internal", ca.Pool()); err != nil || body != "tb\n" {
		t.Errorf("GET with the CA: %q, %v", body, err)
	}
	if _, err := get("other.internal", ca.Pool()); err == nil {
		t.Error("a name the certificate does not hold verified")
	}
	if _, err := get("backend.internal", NewCA(t, "another CA").Pool()); err == nil {
		t.Error("another CA verified the certificate")
	}
}

func TestReplaceFile(t *testing.T) {
	demo := CopyDemoCerts(t)
	ReplaceFile(t, demo.A.Cert, []byte("garbage"))
	if b, err := os.ReadFile(demo.A.Cert); err != nil || string(b) != "garbage" {
		t.Errorf("after ReplaceFile: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(demo.Dir); len(ents) != 7 {
		t.Errorf("%d files in the directory, want the 7 copies (no temporary file left)", len(ents))
	}
}
