package workers

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/upstream"
)

// countedH2C is an HTTP/2 cleartext (prior knowledge) backend that
// answers every request with its status and "name body", counting the
// requests and the connections it got.
type countedH2C struct {
	addr            string
	requests, conns atomic.Int64
	status          atomic.Int64
}

func newCountedH2C(tb testing.TB, name string, status int) *countedH2C {
	tb.Helper()
	b := &countedH2C{}
	b.status.Store(int64(status))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		if r.ProtoMajor != 2 {
			w.WriteHeader(http.StatusHTTPVersionNotSupported)
			return
		}
		w.WriteHeader(int(b.status.Load()))
		fmt.Fprintf(w, "%s %s", name, body)
	})
	srv := httptest.NewUnstartedServer(h2c.NewHandler(h, &http2.Server{}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			b.conns.Add(1)
		}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	b.addr = hostOf(srv.URL)
	return b
}

// h2ClusterConfig is one listener taking HTTP/2 with prior knowledge and
// HTTP/1.1, whose route goes to the http2 cluster "backend" of endpoints.
func h2ClusterConfig(route func(*config.Route), endpoints ...string) *config.Config {
	cfg := retryConfig(route, endpoints...)
	h2cListener(&cfg.Listeners[0])
	cfg.Clusters[0].HTTP2 = true
	return cfg
}

// h2AndH1Get sends GET path with hdr through an HTTP/2 client and an
// HTTP/1.1 client in turn, n requests each, and returns the bodies.
func h2AndH1Get(tb testing.TB, m *Manager, n int, path string, hdr ...string) []string {
	tb.Helper()
	url := "http://" + addr(tb, m, "web") + path
	h2, h1 := h2cClient(tb), newClient(tb)
	var bodies []string
	for i := range 2 * n {
		var resp *http.Response
		var body string
		if i%2 == 0 {
			req := newReq(tb, "GET", url, nil)
			for k := 0; k+1 < len(hdr); k += 2 {
				req.Header.Set(hdr[k], hdr[k+1])
			}
			resp, body = h2Do(tb, h2, req)
		} else {
			resp, body = get(tb, h1, url, hdr...)
		}
		if resp.StatusCode != 200 {
			tb.Fatalf("request %d: %d %q, want 200", i, resp.StatusCode, body)
		}
		bodies = append(bodies, body)
	}
	return bodies
}

// TestH2UpstreamRoundRobinPerRequest: round_robin over two HTTP/2
// endpoints alternates per request, not per connection: the requests of
// one busy client connection (and of HTTP/1.1 clients) split evenly over
// one upstream connection per endpoint. The old transport, whose dial
// asked the balancer, sent them all to one endpoint.
func TestH2UpstreamRoundRobinPerRequest(t *testing.T) {
	a, b := newCountedH2C(t, "a", 200), newCountedH2C(t, "b", 200)
	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, a.addr, b.addr), 1)
	const n = 20
	h2AndH1Get(t, m, n, "/")
	if a.requests.Load() != n || b.requests.Load() != n {
		t.Errorf("endpoints got %d and %d requests, want %d each", a.requests.Load(), b.requests.Load(), n)
	}
	// A burst of concurrent streams shares the connections too.
	c := h2cClient(t)
	url := "http://" + addr(t, m, "web") + "/burst"
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 32 {
		wg.Go(func() {
			resp, err := c.Do(newReq(t, "GET", url, nil))
			if err != nil {
				failed.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d burst requests failed", failed.Load())
	}
	if got := a.requests.Load() + b.requests.Load(); got != 2*n+32 {
		t.Errorf("endpoints got %d requests, want %d", got, 2*n+32)
	}
	if a.conns.Load() != 1 || b.conns.Load() != 1 {
		t.Errorf("endpoints got %d and %d connections, want 1 each (one worker)", a.conns.Load(), b.conns.Load())
	}
	if got := counter(m, "cluster.backend.upstream_cx_total"); got != 2 {
		t.Errorf("upstream_cx_total = %d, want 2", got)
	}
}

// TestH2UpstreamHashOnHeader: ring_hash on a header sends a key's
// requests to one endpoint, from HTTP/2 and HTTP/1.1 clients and every
// worker, and different keys spread.
func TestH2UpstreamHashOnHeader(t *testing.T) {
	var addrs []string
	for _, name := range []string{"a", "b", "c"} {
		addrs = append(addrs, newCountedH2C(t, name, 200).addr)
	}
	cfg := h2ClusterConfig(func(*config.Route) {}, addrs...)
	cfg.Clusters[0].LBPolicy, cfg.Clusters[0].HashOn = config.LBRingHash, "header:X-User"
	m := startManager(t, cfg, 2)
	seen := map[string]bool{}
	for u := range 12 {
		user := fmt.Sprintf("user-%d", u)
		bodies := h2AndH1Get(t, m, 3, "/", "X-User", user)
		for _, b := range bodies[1:] {
			if b != bodies[0] {
				t.Fatalf("%s went to %q, then to %q", user, bodies[0], b)
			}
		}
		seen[bodies[0]] = true
	}
	if len(seen) < 2 {
		t.Errorf("12 users all went to %v", seen)
	}
}

// TestH2UpstreamRetry5xx: with retry_on 5xx, a request that meets the
// endpoint answering 503 is tried on the other one; the client sees 200,
// upstream_rq_retry counts each retry. A PUT with a body from an
// HTTP/1.1 client, buffered whole, is sent again with its body.
func TestH2UpstreamRetry5xx(t *testing.T) {
	bad, good := newCountedH2C(t, "bad", 503), newCountedH2C(t, "good", 200)
	cfg := h2ClusterConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(1) }, bad.addr, good.addr)
	m := startManager(t, cfg, 1)
	for i, b := range h2AndH1Get(t, m, 5, "/") {
		if b != "good " {
			t.Fatalf("request %d: %q, want the good endpoint's", i, b)
		}
	}
	h1 := newClient(t)
	for i := range 4 {
		req := newReq(t, "PUT", "http://"+addr(t, m, "web")+"/put", strings.NewReader("payload"))
		resp, err := h1.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "good payload" {
			t.Fatalf("PUT %d: %d %q, want 200 \"good payload\"", i, resp.StatusCode, body)
		}
	}
	if bad.requests.Load() == 0 {
		t.Fatal("the failing endpoint got no request: the test proves nothing")
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry"); n != uint64(bad.requests.Load()) {
		t.Errorf("upstream_rq_retry = %d, want %d (one per 503)", n, bad.requests.Load())
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry_success"); n != uint64(bad.requests.Load()) {
		t.Errorf("upstream_rq_retry_success = %d, want %d", n, bad.requests.Load())
	}
}

// TestH2UpstreamConnectFailure: a dead endpoint's refused connect goes
// to the live one; a cluster whose every endpoint is dead is tried
// num_retries more times with retry_on connect-failure, then 503.
func TestH2UpstreamConnectFailure(t *testing.T) {
	alive := newCountedH2C(t, "alive", 200)
	cfg := h2ClusterConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"connect-failure"}, new(2) },
		deadPort(t), alive.addr)
	m := startManager(t, cfg, 1)
	h2AndH1Get(t, m, 4, "/")
	if counter(m, "cluster.backend.upstream_cx_connect_fail") == 0 {
		t.Fatal("the dead endpoint was never tried: the test proves nothing")
	}

	dead := h2ClusterConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"connect-failure"}, new(2) }, deadPort(t))
	m2 := startManager(t, dead, 1)
	resp, _ := h2Do(t, h2cClient(t), newReq(t, "GET", "http://"+addr(t, m2, "web")+"/", nil))
	if resp.StatusCode != 503 {
		t.Fatalf("all dead: %d, want 503", resp.StatusCode)
	}
	if n := counter(m2, "cluster.backend.upstream_rq_retry"); n != 2 {
		t.Errorf("upstream_rq_retry = %d, want 2", n)
	}
}

// TestH2UpstreamOutlierEjection: an endpoint answering 500 to HTTP/2
// requests is reported to outlier detection and, after consecutive_5xx
// of them, ejected: every later request goes to the other endpoint.
func TestH2UpstreamOutlierEjection(t *testing.T) {
	bad, good := newCountedH2C(t, "bad", 500), newCountedH2C(t, "good", 200)
	cfg := h2ClusterConfig(func(*config.Route) {}, bad.addr, good.addr)
	cfg.Clusters[0].OutlierDetection = &config.OutlierDetection{
		Consecutive5xx: new(3), BaseEjectionTime: dur(time.Hour), MaxEjectionPercent: new(50),
	}
	m := startManager(t, cfg, 1)
	cl := m.snap.Clusters()[0]
	mon := upstream.NewMonitor(cl, nil)
	if mon == nil {
		t.Fatal("no monitor for a cluster with outlier detection")
	}
	mon.Start(nil)
	t.Cleanup(mon.Stop)

	c := h2cClient(t)
	url := "http://" + addr(t, m, "web") + "/"
	for i := 0; bad.requests.Load() < 3; i++ {
		if i > 20 {
			t.Fatalf("the bad endpoint got %d requests in 20", bad.requests.Load())
		}
		h2Do(t, c, newReq(t, "GET", url, nil))
	}
	waitFor(t, 5*time.Second, "the 5xx endpoint ejected", func() bool {
		return cl.Status().Endpoints[0].Ejected
	})
	before := bad.requests.Load()
	for i, b := range h2AndH1Get(t, m, 5, "/") {
		if b != "good " {
			t.Fatalf("request %d after the ejection: %q", i, b)
		}
	}
	if bad.requests.Load() != before {
		t.Errorf("the ejected endpoint got %d more requests", bad.requests.Load()-before)
	}
}

// TestH2UpstreamPerTryTimeout: a try whose response head does not come
// within per_try_timeout is given up (its stream reset) and tried on the
// other endpoint, and the slow endpoint is reported as failed.
func TestH2UpstreamPerTryTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var slowGot atomic.Int64
	slow := httptest.NewServer(h2c.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowGot.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), &http2.Server{}))
	t.Cleanup(slow.Close)
	good := newCountedH2C(t, "good", 200)
	cfg := h2ClusterConfig(func(r *config.Route) {
		r.RetryOn, r.NumRetries, r.PerTryTimeout = []string{"reset"}, new(1), dur(200*time.Millisecond)
	}, hostOf(slow.URL), good.addr)
	m := startManager(t, cfg, 1)
	for i, b := range h2AndH1Get(t, m, 2, "/") {
		if b != "good " {
			t.Fatalf("request %d: %q", i, b)
		}
	}
	if slowGot.Load() == 0 {
		t.Fatal("the slow endpoint got no request: the test proves nothing")
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry"); n != uint64(slowGot.Load()) {
		t.Errorf("upstream_rq_retry = %d, want %d", n, slowGot.Load())
	}
	if st := m.snap.Clusters()[0].Status(); st.Endpoints[0].Rq5xx == 0 {
		t.Errorf("the slow endpoint's timeouts were not reported: %+v", st.Endpoints[0])
	}
}

// TestH2UpstreamStreamedBodyIsNoRetrySuccess: a request whose body
// streams from the client is tried once, so its response is no retry's
// success, whatever the route's num_retries: upstream_rq_retry_success
// stays 0. (The HTTP/2 upstream's own retry loop counted every such
// response as one before the one retry policy, exchange.Tries, replaced
// it.)
func TestH2UpstreamStreamedBodyIsNoRetrySuccess(t *testing.T) {
	good := newCountedH2C(t, "good", 200)
	cfg := h2ClusterConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(2) }, good.addr)
	m := startManager(t, cfg, 1)
	h2 := h2cClient(t)
	const posts = 3
	for i := range posts {
		req := newReq(t, "POST", "http://"+addr(t, m, "web")+"/post", strings.NewReader("payload"))
		resp, body := h2Do(t, h2, req)
		if resp.StatusCode != 200 || body != "good payload" {
			t.Fatalf("POST %d: %d %q, want 200 \"good payload\"", i, resp.StatusCode, body)
		}
	}
	if n := good.requests.Load(); n != posts {
		t.Fatalf("the endpoint got %d requests, want %d: the test proves nothing", n, posts)
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry"); n != 0 {
		t.Errorf("upstream_rq_retry = %d, want 0", n)
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry_success"); n != 0 {
		t.Errorf("upstream_rq_retry_success = %d, want 0 (no request was retried)", n)
	}
}
