package upstream

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// backend is a real HTTP server on loopback that answers with its name and
// counts the connections it accepted.
type backend struct {
	name     string
	srv      *httptest.Server
	newConns atomic.Int64
	hits     atomic.Int64
}

func (b *backend) addr() string { return b.srv.Listener.Addr().String() }

// newBackend starts a backend; h, if not nil, handles the request after it
// is counted (and must write the response itself).
func newBackend(tb testing.TB, name string, h http.HandlerFunc) *backend {
	tb.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if h != nil {
			h(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, name)
	}))
	b.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			b.newConns.Add(1)
		}
	}
	b.srv.Start()
	tb.Cleanup(b.srv.Close)
	return b
}

// closedAddr returns a loopback address nothing listens on: connecting to it
// is refused at once.
func closedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// newWorkerCluster builds a cluster from spec and worker w's view of it,
// whose idle connections are closed at the end of the test.
func newWorkerCluster(tb testing.TB, spec config.Cluster, w int) *WorkerCluster {
	tb.Helper()
	if spec.Name == "" {
		spec.Name = "backend"
	}
	// As config.Load leaves it: NewCluster takes every value as given.
	cfg := config.Config{Clusters: []config.Cluster{spec}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		tb.Fatalf("NewCluster: %v", err)
	}
	wc := c.ForWorker(w)
	tb.Cleanup(wc.CloseIdle)
	return wc
}

func addrs(bs ...*backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.addr()
	}
	return out
}

// get sends a GET through rt, reads the whole response and returns its
// body (a backend's name).
func get(tb testing.TB, wc *WorkerCluster) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wc.Acquire(ctx)
	if err != nil {
		tb.Fatalf("Acquire: %v", err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /path HTTP/1.1\r\nHost: client.example\r\n\r\n"); err != nil {
		c.Discard()
		tb.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Discard()
		tb.Fatalf("reading response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.Discard()
		tb.Fatalf("reading response: %v", err)
	}
	// bufio read exactly the response: the backend sends nothing more.
	c.Release(!resp.Close)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("status %d, body %q", resp.StatusCode, body)
	}
	return strings.TrimSpace(string(body))
}
