package workers

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// namedBackend answers every request with status and a body naming it,
// and counts the requests it got.
func namedBackend(tb testing.TB, name string, status int, got *atomic.Int64) string {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got != nil {
			got.Add(1)
		}
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
		io.WriteString(w, name)
	}))
	tb.Cleanup(srv.Close)
	return hostOf(srv.URL)
}

// retryConfig is one http listener whose only route goes to a round-robin
// cluster of endpoints with retry_on.
func retryConfig(route func(*config.Route), endpoints ...string) *config.Config {
	rt := toCluster("/", "backend")
	route(&rt)
	return &config.Config{
		Listeners: []config.Listener{httpListener("web", rt)},
		Clusters:  []config.Cluster{cluster("backend", endpoints...)},
	}
}

// TestRetry5xxToAnotherHost: with retry_on 5xx, a request whose first
// try meets the endpoint that answers 503 is sent to the other one, and
// the 503 never reaches the client.
func TestRetry5xxToAnotherHost(t *testing.T) {
	var bad, good atomic.Int64
	cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(1) },
		namedBackend(t, "bad", 503, &bad), namedBackend(t, "good", 200, &good))
	m := startManager(t, cfg, 1)
	c := newClient(t)
	for i := range 10 {
		resp, body := get(t, c, "http://"+addr(t, m, "web")+"/")
		if resp.StatusCode != 200 || body != "good" {
			t.Fatalf("request %d: %d %q, want the good endpoint's 200", i, resp.StatusCode, body)
		}
	}
	if bad.Load() == 0 {
		t.Fatal("the failing endpoint got no request: the test proves nothing")
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry"); n != uint64(bad.Load()) {
		t.Errorf("upstream_rq_retry = %d, want %d (one per 503)", n, bad.Load())
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry_success"); n != uint64(bad.Load()) {
		t.Errorf("upstream_rq_retry_success = %d, want %d", n, bad.Load())
	}
}

// TestRetryGatewayErrorLeaves500: gateway-error retries 502-504, not a
// 500, which the client gets as it came.
func TestRetryGatewayErrorLeaves500(t *testing.T) {
	var hits atomic.Int64
	cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"gateway-error"}, new(2) },
		namedBackend(t, "oops", 500, &hits))
	m := startManager(t, cfg, 1)
	resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.StatusCode != 500 || body != "oops" || hits.Load() != 1 {
		t.Fatalf("got %d %q after %d tries, want the 500 after one", resp.StatusCode, body, hits.Load())
	}
}

// TestRetriesExhaustedForwardsLast: when every try answers 503, the last
// 503 is forwarded, after 1 + num_retries tries.
func TestRetriesExhaustedForwardsLast(t *testing.T) {
	var hits atomic.Int64
	cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(2) },
		namedBackend(t, "down", 503, &hits))
	m := startManager(t, cfg, 1)
	resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.StatusCode != 503 || body != "down" || hits.Load() != 3 {
		t.Fatalf("got %d %q after %d tries, want the 503 after 3", resp.StatusCode, body, hits.Load())
	}
}

// resettingBackend reads a request head and closes the connection
// without an answer, counting the requests.
func resettingBackend(tb testing.TB, got *atomic.Int64) string {
	return rawBackend(tb, func(c net.Conn) {
		buf := make([]byte, 4096)
		if n, _ := c.Read(buf); n > 0 {
			got.Add(1)
		}
	})
}

// TestPOSTNotRetriedAfterSent: a POST whose bytes reached the upstream is
// not sent again on a reset (it may have been acted on), a GET is, and a
// POST is with retry_non_idempotent.
func TestPOSTNotRetriedAfterSent(t *testing.T) {
	for _, tt := range []struct {
		method        string
		nonIdempotent bool
		wantTries     int64
	}{
		{"POST", false, 1},
		{"GET", false, 2},
		{"POST", true, 2},
	} {
		t.Run(fmt.Sprintf("%s/retry_non_idempotent=%v", tt.method, tt.nonIdempotent), func(t *testing.T) {
			var got atomic.Int64
			cfg := retryConfig(func(r *config.Route) {
				r.RetryOn, r.NumRetries, r.RetryNonIdempotent = []string{"reset"}, new(1), tt.nonIdempotent
			}, resettingBackend(t, &got), resettingBackend(t, &got))
			m := startManager(t, cfg, 1)
			resp := rawRequest(t, addr(t, m, "web"), tt.method+" / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
			if resp.StatusCode != 502 {
				t.Errorf("status %d, want 502", resp.StatusCode)
			}
			if got.Load() != tt.wantTries {
				t.Errorf("the upstreams got %d tries, want %d", got.Load(), tt.wantTries)
			}
		})
	}
}

// TestPerTryTimeout: a try that gets no response head within
// per_try_timeout is abandoned and the request sent to the other
// endpoint, well before the route's timeout.
func TestPerTryTimeout(t *testing.T) {
	stall := make(chan struct{})
	t.Cleanup(func() { close(stall) })
	slow := rawBackend(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		c.Read(buf)
		<-stall
	})
	cfg := retryConfig(func(r *config.Route) {
		r.RetryOn, r.NumRetries = []string{"gateway-error"}, new(1)
		r.PerTryTimeout, r.Timeout = dur(150*time.Millisecond), dur(10*time.Second)
	}, slow, namedBackend(t, "fast", 200, nil))
	m := startManager(t, cfg, 1)
	c := newClient(t)
	for i := range 4 {
		start := time.Now()
		resp, body := get(t, c, "http://"+addr(t, m, "web")+"/")
		if resp.StatusCode != 200 || body != "fast" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("request %d took %v: per_try_timeout did not cut the slow try", i, d)
		}
	}
	if counter(m, "cluster.backend.upstream_rq_retry") == 0 {
		t.Fatal("no retry counted: the slow endpoint was never tried, the test proves nothing")
	}
}

// TestConnectFailureGoesToAnotherHost: a refused connect is tried on the
// next endpoint, and with retry_on connect-failure a cluster whose every
// endpoint refuses is tried num_retries more times.
func TestConnectFailureGoesToAnotherHost(t *testing.T) {
	cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"connect-failure"}, new(2) },
		deadPort(t), namedBackend(t, "alive", 200, nil))
	m := startManager(t, cfg, 1)
	c := newClient(t)
	for i := range 6 {
		if resp, body := get(t, c, "http://"+addr(t, m, "web")+"/"); resp.StatusCode != 200 || body != "alive" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if counter(m, "cluster.backend.upstream_cx_connect_fail") == 0 {
		t.Fatal("the dead endpoint was never tried: the test proves nothing")
	}

	dead := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"connect-failure"}, new(2) }, deadPort(t))
	m2 := startManager(t, dead, 1)
	if resp, _ := get(t, c, "http://"+addr(t, m2, "web")+"/"); resp.StatusCode != 503 {
		t.Fatalf("all dead: %d, want 503", resp.StatusCode)
	}
	if n := counter(m2, "cluster.backend.upstream_rq_retry"); n != 2 {
		t.Errorf("upstream_rq_retry = %d, want 2", n)
	}
}

// TestHashOnHeader: with maglev or ring_hash keyed by a header, a user's
// requests reach one endpoint from every worker, and users spread.
func TestHashOnHeader(t *testing.T) {
	for _, policy := range []string{config.LBRingHash, config.LBMaglev} {
		t.Run(policy, func(t *testing.T) {
			cfg := retryConfig(func(*config.Route) {},
				namedBackend(t, "a", 200, nil), namedBackend(t, "b", 200, nil), namedBackend(t, "c", 200, nil))
			cfg.Clusters[0].LBPolicy, cfg.Clusters[0].HashOn = policy, "header:X-User"
			m := startManager(t, cfg, 2)
			seen := map[string]bool{}
			for u := range 12 {
				user := fmt.Sprintf("user-%d", u)
				first := ""
				for i := range 6 {
					// A new connection each time: the workers take turns.
					resp, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/", "x-user", user)
					if resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
					if i == 0 {
						first = body
					} else if body != first {
						t.Fatalf("%s went to %s, then to %s", user, first, body)
					}
				}
				seen[first] = true
			}
			if len(seen) < 2 {
				t.Errorf("12 users all went to %v", seen)
			}
		})
	}
}

// TestHashOnSourceIP: with hash_on = "source_ip", every connection from
// one client address reaches the same endpoint, through a TCP listener
// and an HTTP one (all from 127.0.0.1 here; random picks among four
// endpoints would differ within ten connections).
func TestHashOnSourceIP(t *testing.T) {
	var tcpBackends, httpBackends []string
	for i := range 4 {
		name := fmt.Sprintf("b%d", i)
		tcpBackends = append(tcpBackends, rawBackend(t, func(c net.Conn) { io.WriteString(c, name) }))
		httpBackends = append(httpBackends, namedBackend(t, name, 200, nil))
	}
	cfg := &config.Config{
		Listeners: []config.Listener{tcpListener("tcp", "tcpc"), httpListener("web", toCluster("/", "httpc"))},
		Clusters:  []config.Cluster{cluster("tcpc", tcpBackends...), cluster("httpc", httpBackends...)},
	}
	for i := range cfg.Clusters {
		cfg.Clusters[i].LBPolicy, cfg.Clusters[i].HashOn = config.LBRingHash, config.HashOnSourceIP
	}
	m := startManager(t, cfg, 2)
	first := ""
	for i := range 10 {
		c := dialTCP(t, addr(t, m, "tcp"))
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		c.Close()
		if i == 0 {
			first = string(b)
		} else if string(b) != first {
			t.Fatalf("tcp connection %d reached %q, the first %q", i, b, first)
		}
	}
	first = ""
	for i := range 10 {
		_, body := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
		if i == 0 {
			first = body
		} else if body != first {
			t.Fatalf("http request %d reached %q, the first %q", i, body, first)
		}
	}
}
