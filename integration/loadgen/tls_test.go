package loadgen

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
)

// demoCerts is the repository's demo certificates (examples/tls).
var demoCerts = filepath.Join("..", "..", "examples", "tls")

// tlsServer serves "ok" over TLS with the demo a.example.com certificate,
// at most maxVersion, and returns its https URL.
func tlsServer(t *testing.T, maxVersion uint16) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(demoCerts, "a.example.com.pem"), filepath.Join(demoCerts, "a.example.com.key"))
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok"))
	}))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: maxVersion}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.URL + "/"
}

func demoClientTLS(t *testing.T, serverName string) *tls.Config {
	t.Helper()
	c, err := ClientTLS(filepath.Join(demoCerts, "ca.pem"), serverName)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTLSKeepAliveHandshakesOncePerConnection(t *testing.T) {
	url := tlsServer(t, 0)
	res, err := Do(context.Background(), Options{
		URL: url, Mode: KeepAlive, Clients: 2, Requests: 60,
		TLS: demoClientTLS(t, "a.example.com"), SessionCache: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Failed() != 0 || res.OK() != 60 {
		t.Fatalf("want 60 OK, got %v", res)
	}
	if res.FullHandshakes != 2 || res.ResumedHandshakes != 0 || res.Conns != 2 {
		t.Errorf("2 keep-alive clients: want 2 connections and 2 full handshakes, got %d conns, %d full, %d resumed",
			res.Conns, res.FullHandshakes, res.ResumedHandshakes)
	}
}

// TestTLSConnPerRequestResumes: with a session cache, only a client's
// first connection does a full handshake (TLS 1.3 and 1.2 tickets);
// without one, every connection does.
func TestTLSConnPerRequestResumes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version uint16
	}{{"TLS1.3", tls.VersionTLS13}, {"TLS1.2", tls.VersionTLS12}} {
		t.Run(tc.name, func(t *testing.T) {
			url := tlsServer(t, tc.version)
			const n = 20
			for _, cache := range []bool{true, false} {
				res, err := Do(context.Background(), Options{
					URL: url, Mode: ConnPerRequest, Clients: 1, Requests: n,
					TLS: demoClientTLS(t, "a.example.com"), SessionCache: cache,
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("session cache %v: %v", cache, res)
				if res.Failed() != 0 || res.OK() != n {
					t.Fatalf("want %d OK, got %v", n, res)
				}
				wantFull, wantResumed := int64(1), int64(n-1)
				if !cache {
					wantFull, wantResumed = n, 0
				}
				if res.FullHandshakes != wantFull || res.ResumedHandshakes != wantResumed {
					t.Errorf("session cache %v: %d full and %d resumed handshakes, want %d and %d",
						cache, res.FullHandshakes, res.ResumedHandshakes, wantFull, wantResumed)
				}
			}
		})
	}
}

// TestTLSVerificationFailureIsClassTLS: a certificate that does not name
// the server name the client sends is a failed request of class tls, and
// no handshake is counted as completed.
func TestTLSVerificationFailureIsClassTLS(t *testing.T) {
	url := tlsServer(t, 0)
	res, err := Do(context.Background(), Options{
		URL: url, Mode: ConnPerRequest, Clients: 1, Requests: 3, PauseAfterFailure: -1,
		TLS: demoClientTLS(t, "b.example.com"), Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Count(ClassTLS) != 3 || res.Failed() != 3 {
		t.Errorf("want 3 requests failed as tls, got %v", res)
	}
	if res.FullHandshakes+res.ResumedHandshakes != 0 {
		t.Errorf("failed handshakes counted as completed: %v", res)
	}
}

func TestClientTLSRejectsAFileWithoutCertificates(t *testing.T) {
	if _, err := ClientTLS(filepath.Join(demoCerts, "a.example.com.key"), "a.example.com"); err == nil {
		t.Error("a key file taken as a CA bundle")
	}
	if _, err := ClientTLS(filepath.Join(demoCerts, "missing.pem"), "a.example.com"); err == nil {
		t.Error("a missing file taken as a CA bundle")
	}
}
