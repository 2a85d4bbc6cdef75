package workers

import (
	"bufio"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// demoTLS is a file of examples/tls: the demo CA, and a.example.com's
// certificate signed by it.
func demoTLS(tb testing.TB, name string) string {
	tb.Helper()
	p, err := filepath.Abs(filepath.Join("..", "examples", "tls", name))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// tlsUpstream serves fn on every TLS connection accepted with
// a.example.com's certificate, and counts the connections.
func tlsUpstream(tb testing.TB, fn func(net.Conn)) (string, *atomic.Int64) {
	tb.Helper()
	cert, err := tls.LoadX509KeyPair(demoTLS(tb, "a.example.com.pem"), demoTLS(tb, "a.example.com.key"))
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		tb.Fatal(err)
	}
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				fn(c)
			}()
		}
	}()
	tb.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), &accepted
}

// tlsClusterConfig is proxyConfig (http) or tcpConfig (tcp) whose cluster
// speaks TLS to backend, trusting the demo CA, as a.example.com.
func tlsClusterConfig(tb testing.TB, cfg *config.Config) *config.Config {
	cfg.Clusters[0].TLS = &config.ClusterTLS{CA: demoTLS(tb, "ca.pem"), ServerName: "a.example.com"}
	return cfg
}

// HTTP requests to a TLS cluster: keep-alive over one pooled upstream TLS
// connection, request bodies (sent with the head, and streamed), and an
// upgrade relayed over TLS.
func TestHTTPToTLSCluster(t *testing.T) {
	be, accepted := tlsUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.Header.Get("Upgrade") == "echo" {
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
				io.Copy(c, br)
				return
			}
			body, _ := io.ReadAll(req.Body)
			reply := "tls:" + req.Method + ":" + string(body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(reply))+"\r\n\r\n"+reply)
		}
	})
	m := startManager(t, tlsClusterConfig(t, proxyConfig(be)), 1)
	url := "http://" + addr(t, m, "web") + "/"
	client := newClient(t)
	for i := range 10 {
		resp, body := get(t, client, url)
		if resp.StatusCode != 200 || body != "tls:GET:" {
			t.Fatalf("GET %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d upstream TLS connections for 10 keep-alive requests, want 1", n)
	}
	for _, size := range []int{5, 1 << 20} {
		payload := strings.Repeat("x", size)
		resp, err := client.Post(url, "text/plain", strings.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "tls:POST:"+payload {
			t.Fatalf("POST of %d bytes: %d, %d bytes back", size, resp.StatusCode, len(body))
		}
	}
	if n := counter(m, "cluster.backend.ssl.handshake"); n == 0 || n != uint64(accepted.Load()) {
		t.Errorf("cluster.backend.ssl.handshake = %d for %d connections", n, accepted.Load())
	}

	c, br := dialUpgrade(t, addr(t, m, "web"))
	if err := echoLine(t, c, br, "over tls\n"); err != nil {
		t.Fatalf("upgraded connection: %v", err)
	}
}

// An endpoint whose certificate does not chain to the cluster's CA gets
// no request: 503, counted in ssl.connection_error.
func TestHTTPToTLSClusterWrongCA(t *testing.T) {
	// httptest's own certificate, which the demo CA did not sign.
	be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a request reached an upstream whose certificate did not verify")
	}))
	be.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	be.StartTLS()
	t.Cleanup(be.Close)
	m := startManager(t, tlsClusterConfig(t, proxyConfig(be.Listener.Addr().String())), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "TLS handshake failed") {
		t.Errorf("%d %q, want 503 saying the TLS handshake failed (no upstream took the request)", resp.StatusCode, body)
	}
	if n := counter(m, "cluster.backend.ssl.connection_error"); n != 1 {
		t.Errorf("ssl.connection_error = %d, want 1", n)
	}
	if n := counter(m, "cluster.backend.upstream_cx_connect_fail"); n != 1 {
		t.Errorf("upstream_cx_connect_fail = %d, want 1", n)
	}
}

// A tcp listener whose cluster has TLS encrypts the client's plaintext
// towards the upstream, both ways, half-close included.
func TestTCPToTLSCluster(t *testing.T) {
	be, accepted := tlsUpstream(t, func(c net.Conn) {
		b, err := io.ReadAll(c) // to the client's close_notify
		if err != nil {
			return
		}
		c.Write([]byte("got:"))
		c.Write(b)
	})
	m := startManager(t, tlsClusterConfig(t, tcpConfig(be, 0)), 1)
	c := dialTCP(t, addr(t, m, "tcp"))
	if _, err := c.Write([]byte("hello, tls upstream")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got:hello, tls upstream" {
		t.Fatalf("got %q %v", got, err)
	}
	if accepted.Load() != 1 || counter(m, "cluster.backend.ssl.handshake") != 1 {
		t.Errorf("%d TLS connections accepted, ssl.handshake %d; want 1 and 1", accepted.Load(), counter(m, "cluster.backend.ssl.handshake"))
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
}
