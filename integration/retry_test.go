package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestRetryUnderLoad: one endpoint refuses connections and one answers
// 503; with retry_on connect-failure and 5xx every request reaches the
// good one, no client sees a failure, and the retries are counted.
func TestRetryUnderLoad(t *testing.T) {
	t.Parallel()
	good := harness.StartHTTPBackend(t, "good")
	dead := startKillable(t, "dead")
	dead.kill()
	bad := startKillable(t, "bad")
	bad.setStatus(http.StatusServiceUnavailable)
	cfg := restartConfig("1s", "2s", "100ms", good.Addr)
	cfg.Clusters[0].Endpoints = []string{dead.Addr, bad.Addr, good.Addr}
	cfg.Listeners[0].Routes[1].Extra = "  retry_on = [\"connect-failure\", \"5xx\"]\n  num_retries = 2\n  per_try_timeout = \"2s\""
	c := startChain(t, cfg)
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(t.Context(), loadgen.Options{
			URL: c.serving.URL("web", "/"), Mode: mode, Clients: 4, Requests: 300,
			Timeout: 5 * time.Second, Check: backendCheck("good"),
		})
		if err != nil {
			t.Fatal(err)
		}
		res := r.Wait()
		t.Log(res)
		if res.Failed() != 0 {
			t.Fatalf("failures: %v", res)
		}
	}
	if bad.count.get() == 0 {
		t.Fatal("the 503 endpoint got nothing: the test proves nothing")
	}
	st := adminStats(t, c.serving)
	retries, _ := st.counter("cluster.backend.upstream_rq_retry")
	if retries < uint64(bad.count.get()) {
		t.Errorf("upstream_rq_retry = %d, but %d answers were 503", retries, bad.count.get())
	}
	if n, _ := st.counter("cluster.backend.upstream_rq_retry_success"); n == 0 {
		t.Error("upstream_rq_retry_success = 0")
	}
}

// TestPOSTNotRetriedOnReset: an upstream that reads a request and resets
// the connection may have acted on it: a POST is answered 502 after one
// try, a GET is tried again (retry_on reset).
func TestPOSTNotRetriedOnReset(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				got.Add(1)
				conn.(*net.TCPConn).SetLinger(0) // a reset, not a FIN
			}()
		}
	}()
	cfg := restartConfig("1s", "2s", "100ms", ln.Addr().String())
	cfg.Listeners[0].Routes[1].Extra = "  retry_on = [\"reset\"]\n  num_retries = 1"
	c := startChain(t, cfg)
	cl := newClient(5 * time.Second)
	for _, tt := range []struct {
		method string
		tries  int64
	}{{"POST", 1}, {"GET", 2}} {
		got.Store(0)
		req, _ := http.NewRequest(tt.method, c.serving.URL("web", "/"), strings.NewReader("order=1"))
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || got.Load() != tt.tries {
			t.Errorf("%s: status %d after %d tries, want 502 after %d", tt.method, resp.StatusCode, got.Load(), tt.tries)
		}
	}
}
