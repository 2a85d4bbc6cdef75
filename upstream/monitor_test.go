package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// newMonitored builds a cluster from spec (defaults filled in), worker 0's
// view bound to a fresh stats store, and its monitor after the first
// round of checks, started.
func newMonitored(tb testing.TB, spec config.Cluster) (*Cluster, *WorkerCluster, *Monitor, *stats.Store) {
	tb.Helper()
	if spec.Name == "" {
		spec.Name = "backend"
	}
	cfg := config.Config{Clusters: []config.Cluster{spec}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		tb.Fatal(err)
	}
	st, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		tb.Fatal(err)
	}
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, c.Name, 1))
	tb.Cleanup(wc.CloseIdle)
	m := NewMonitor(c, nil)
	if m == nil {
		tb.Fatal("NewMonitor: nil for a cluster with checks or outlier detection")
	}
	m.CheckOnce(context.Background())
	m.Start(st)
	tb.Cleanup(m.Stop)
	return c, wc, m, st
}

// waitFor polls cond until it holds, for at most d.
func waitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exchange sends one GET through wc and reports the status to the cluster
// as the HTTP data path does; it returns the backend's body.
func exchange(tb testing.TB, wc *WorkerCluster) (int, string) {
	tb.Helper()
	c, err := wc.Acquire(context.Background())
	if err != nil {
		tb.Fatalf("Acquire: %v", err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		wc.ReportStatus(c.EndpointIndex(), 0)
		c.Discard()
		tb.Fatalf("response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wc.ReportStatus(c.EndpointIndex(), resp.StatusCode)
	c.Release(!resp.Close)
	return resp.StatusCode, string(body)
}

// healthyBackend answers /healthz with 200 while ok holds, else 503, and
// any other path with its name.
func healthyBackend(tb testing.TB, name string, ok *atomic.Bool) *backend {
	return newBackend(tb, name, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			if !ok.Load() {
				w.WriteHeader(503)
			}
			return
		}
		io.WriteString(w, name)
	})
}

func TestHealthCheckSkipsUnhealthyAndTakesItBack(t *testing.T) {
	var okA, okB atomic.Bool
	okA.Store(true)
	a, b := healthyBackend(t, "a", &okA), healthyBackend(t, "b", &okB)
	c, wc, _, st := newMonitored(t, config.Cluster{
		Endpoints: addrs(a, b),
		HealthCheck: &config.HealthCheck{Path: "/healthz", Interval: config.Duration(20 * time.Millisecond),
			Timeout: config.Duration(time.Second), UnhealthyThreshold: 2, HealthyThreshold: 2},
	})
	// After the first round, b (503) takes nothing.
	for range 20 {
		if _, body := exchange(t, wc); body != "a" {
			t.Fatalf("request went to %q, which failed its first check", body)
		}
	}
	if got := st.Gauge("cluster.backend.membership_healthy", stats.GaugeNewest).Value(); got != 1 {
		t.Errorf("membership_healthy = %d, want 1", got)
	}
	okB.Store(true)
	waitFor(t, 5*time.Second, "b taken back after passing healthy_threshold checks", func() bool {
		return c.state.hosts.Load().Usable() == 2
	})
	okA.Store(false)
	waitFor(t, 5*time.Second, "a marked unhealthy", func() bool {
		hs := c.state.hosts.Load()
		return hs.Usable() == 1 && !hs.healthy[0]
	})
	for range 20 {
		if _, body := exchange(t, wc); body != "b" {
			t.Fatalf("request went to %q, which is unhealthy", body)
		}
	}
	if st.Counter("cluster.backend.health_check.failure").Value() == 0 ||
		st.Counter("cluster.backend.health_check.success").Value() == 0 ||
		st.Counter("cluster.backend.health_check.attempt").Value() < 4 {
		t.Errorf("health_check counters not counted")
	}
	if es := c.Status().Endpoints; es[0].HealthCheck != CheckUnhealthy || es[1].HealthCheck != CheckHealthy || es[1].RqTotal < 20 {
		t.Errorf("status: %+v", es)
	}
}

func TestTCPHealthCheckAndPanicMode(t *testing.T) {
	live := newBackend(t, "live", nil)
	dead := closedAddr(t)
	c, wc, _, st := newMonitored(t, config.Cluster{
		Endpoints:   []string{dead, live.addr()},
		HealthCheck: &config.HealthCheck{Interval: config.Duration(20 * time.Millisecond)},
	})
	hs := c.state.hosts.Load()
	if hs.Panic() || hs.Usable() != 1 || hs.healthy[0] {
		t.Fatalf("after the first round: usable %v panic %v, want only the live endpoint", hs.usable, hs.panic)
	}
	// Worker 0's round robin would start at the dead endpoint: nothing
	// is tried there, no connect fails.
	for range 10 {
		exchange(t, wc)
	}
	if n := st.Counter("cluster.backend.upstream_cx_connect_fail").Value(); n != 0 {
		t.Errorf("%d connects to the unhealthy endpoint", n)
	}
	live.srv.Close()
	waitFor(t, 5*time.Second, "panic mode once no endpoint is healthy", func() bool {
		return c.state.hosts.Load().Panic()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := wc.Acquire(ctx); err == nil {
		t.Fatal("Acquire succeeded with every endpoint down")
	}
	if st.Counter("cluster.backend.lb_healthy_panic").Value() == 0 {
		t.Error("lb_healthy_panic not counted")
	}
}

func TestOutlierEjectionAndReturn(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	good := newBackend(t, "good", nil)
	bad := newBackend(t, "bad", func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.WriteHeader(500)
		}
		io.WriteString(w, "bad")
	})
	base := 300 * time.Millisecond
	c, wc, m, st := newMonitored(t, config.Cluster{
		Endpoints: addrs(bad, good),
		OutlierDetection: &config.OutlierDetection{Consecutive5xx: new(3), BaseEjectionTime: config.Duration(base),
			MaxEjectionPercent: new(50)},
	})
	fives := 0
	for range 50 {
		if status, _ := exchange(t, wc); status == 500 {
			fives++
		}
		if c.state.hosts.Load().Usable() == 1 {
			break
		}
	}
	waitFor(t, 2*time.Second, "bad ejected", func() bool { return c.state.hosts.Load().Usable() == 1 })
	ejectedAt := time.Now()
	if fives != 3 {
		// The monitor may act a moment after the third 5xx; a fourth
		// would mean the threshold is off by one or more.
		t.Logf("%d 5xx before the ejection was seen", fives)
	}
	for range 20 {
		if _, body := exchange(t, wc); body != "good" {
			t.Fatalf("request went to %q while it is ejected", body)
		}
	}
	if st.Counter("cluster.backend.outlier_detection.ejections_enforced_total").Value() != 1 ||
		st.Gauge("cluster.backend.outlier_detection.ejections_active", stats.GaugeNewest).Value() != 1 {
		t.Error("ejection not counted")
	}
	if e := m.Endpoints()[0]; !e.Ejected || e.Ejections != 1 {
		t.Errorf("endpoint view: %+v", e)
	}
	fail.Store(false)
	waitFor(t, 5*time.Second, "bad back after base_ejection_time", func() bool { return c.state.hosts.Load().Usable() == 2 })
	if d := time.Since(ejectedAt); d < base-50*time.Millisecond {
		t.Errorf("back after %v, before base_ejection_time %v", d, base)
	}
	seen := false
	for range 10 {
		if _, body := exchange(t, wc); body == "bad" {
			seen = true
		}
	}
	if !seen {
		t.Error("the returned endpoint takes no requests")
	}
}

func TestMaxEjectionPercent(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) }
	a, b := newBackend(t, "a", h), newBackend(t, "b", h)
	c, wc, _, st := newMonitored(t, config.Cluster{
		Endpoints: addrs(a, b),
		OutlierDetection: &config.OutlierDetection{Consecutive5xx: new(2), BaseEjectionTime: config.Duration(time.Hour),
			MaxEjectionPercent: new(50)},
	})
	overflow := st.Counter("cluster.backend.outlier_detection.ejections_overflow")
	for i := 0; i < 200 && overflow.Value() == 0; i++ {
		exchange(t, wc)
		if i%10 == 9 {
			time.Sleep(10 * time.Millisecond) // let the monitor act
		}
	}
	waitFor(t, 2*time.Second, "the second ejection refused", func() bool { return overflow.Value() > 0 })
	hs := c.state.hosts.Load()
	if hs.Usable() != 1 || hs.Panic() {
		t.Fatalf("usable %v: want exactly one of two endpoints ejected (50%%)", hs.usable)
	}
}

func TestConnectFailureEjects(t *testing.T) {
	live := newBackend(t, "live", nil)
	c, wc, _, _ := newMonitored(t, config.Cluster{
		Endpoints: []string{closedAddr(t), live.addr()},
		OutlierDetection: &config.OutlierDetection{ConsecutiveConnectFailure: new(2),
			BaseEjectionTime: config.Duration(time.Hour), MaxEjectionPercent: new(50)},
	})
	for range 10 {
		if _, body := exchange(t, wc); body != "live" {
			t.Fatalf("answered by %q", body)
		}
	}
	waitFor(t, 2*time.Second, "the refusing endpoint ejected", func() bool {
		hs := c.state.hosts.Load()
		return hs.Usable() == 1 && hs.ejected[0]
	})
	if n := c.Status().Endpoints[0].CxConnectFail; n < 2 {
		t.Errorf("cx_connect_fail of the dead endpoint = %d, want >= 2", n)
	}
}

func TestCircuitBreakers(t *testing.T) {
	be := newBackend(t, "b", nil)
	cfg := config.Config{Clusters: []config.Cluster{{Name: "cb", Endpoints: addrs(be),
		CircuitBreakers: &config.CircuitBreakers{MaxRequests: 2, MaxConnections: 3, MaxPendingRequests: 5, MaxRetries: new(1)}}}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _ := stats.New(stats.Options{Workers: 2})
	wc0, wc1 := c.ForWorker(0), c.ForWorker(1)
	wc0.BindStats(NewStats(st, "cb", 1))
	wc1.BindStats(NewStats(st, "cb", 2))
	t.Cleanup(wc0.CloseIdle)
	t.Cleanup(wc1.CloseIdle)
	ctx := context.Background()
	c1, err := wc0.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := wc1.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The limit is the cluster's, over both workers.
	start := time.Now()
	_, err = wc0.Acquire(ctx)
	var oe *OverflowError
	if !errors.Is(err, ErrOverflow) || !errors.As(err, &oe) || oe.Limit != "max_requests" {
		t.Fatalf("third request: %v, want max_requests overflow", err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("refusal took %v", d)
	}
	if n := st.Counter("cluster.cb.upstream_rq_pending_overflow").Value(); n != 1 {
		t.Errorf("upstream_rq_pending_overflow = %d, want 1", n)
	}
	// A retry holds one of max_retries besides a request.
	c1.Release(true)
	r1, err := wc0.AcquireFresh(ctx, 0)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	c2.Release(true)
	if _, err := wc0.AcquireFresh(ctx, 0); !errors.As(err, &oe) || oe.Limit != "max_retries" {
		t.Fatalf("second retry in flight: %v, want max_retries overflow", err)
	}
	r1.Release(true)
	// Three connections are open (two pooled, one was r1's): a fourth
	// needs a new connection only when none is idle.
	if s := c.Status().Breakers; s.Requests != 0 || s.Retries != 0 || s.Connections != 3 {
		t.Errorf("breakers after releasing everything: %+v", s)
	}
	a, _ := wc0.Acquire(ctx) // pooled
	b, _ := wc1.Acquire(ctx) // pooled
	if a == nil || b == nil || !a.Reused() || !b.Reused() {
		t.Fatal("pooled connections not reused")
	}
	a.Release(true)
	b.Release(true)
	// Worker 1 has one idle connection; worker 0 two. Take all three,
	// then the next request needs a fourth connection.
	var held []*Conn
	for range 2 {
		x, err := wc0.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, x)
	}
	for _, x := range held {
		x.Release(true)
	}
	if n := c.Status().Breakers.Connections; n > 3 {
		t.Fatalf("%d connections open, max_connections 3", n)
	}
}

func TestMaxConnectionsOverflow(t *testing.T) {
	be := newBackend(t, "b", nil)
	cfg := config.Config{Clusters: []config.Cluster{{Name: "cx", Endpoints: addrs(be), MaxIdlePerEndpoint: new(0),
		CircuitBreakers: &config.CircuitBreakers{MaxConnections: 1}}}}
	cfg.SetDefaults() // keeps the explicit 0
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _ := stats.New(stats.Options{Workers: 1})
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, "cx", 1))
	held, err := wc.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var oe *OverflowError
	if _, err := wc.Acquire(context.Background()); !errors.As(err, &oe) || oe.Limit != "max_connections" {
		t.Fatalf("second connection: %v, want max_connections overflow", err)
	}
	if n := st.Counter("cluster.cx.upstream_cx_overflow").Value(); n != 1 {
		t.Errorf("upstream_cx_overflow = %d, want 1", n)
	}
	held.Release(false)
	c2, err := wc.Acquire(context.Background())
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	c2.Release(false)
	if s := c.Status().Breakers; s.Connections != 0 || s.Requests != 0 || s.PendingRequests != 0 {
		t.Errorf("breakers leak: %+v", s)
	}
}

func TestAcquireDoesNotAllocateWithResilience(t *testing.T) {
	be := newBackend(t, "b", nil)
	_, wc, _, _ := newMonitored(t, config.Cluster{
		Endpoints:        addrs(be),
		OutlierDetection: &config.OutlierDetection{},
		CircuitBreakers:  &config.CircuitBreakers{},
	})
	exchange(t, wc) // one pooled connection
	ctx := context.Background()
	n := testing.AllocsPerRun(100, func() {
		c, err := wc.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wc.ReportStatus(c.EndpointIndex(), 200)
		c.Release(true)
	})
	if n != 0 {
		t.Errorf("%v allocations per pooled Acquire, report and Release", n)
	}
}

// stuckListener returns a loopback address whose accept queue is full and
// never drained: a connect to it hangs (the kernel drops the SYN) until
// the dialer's timeout. The socket is made by hand for a backlog of 1.
func stuckListener(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	var held []net.Conn
	tb.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 16 { // bounded: a backlog of 1 fills after two or three
		c, err := net.DialTimeout("tcp4", addr, 200*time.Millisecond)
		if err != nil {
			return addr // a connect that hangs: the queue is full
		}
		held = append(held, c)
	}
	tb.Skip("could not fill the accept queue of a loopback listener")
	return ""
}

// TestMaxPendingRequests: requests waiting for a connection to be
// established are bounded; one past the bound is refused at once.
func TestMaxPendingRequests(t *testing.T) {
	addr := stuckListener(t)
	cfg := config.Config{Clusters: []config.Cluster{{Name: "pend", Endpoints: []string{addr},
		ConnectTimeout:  config.Duration(3 * time.Second),
		CircuitBreakers: &config.CircuitBreakers{MaxPendingRequests: 1}}}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		t.Fatal(err)
	}
	st, _ := stats.New(stats.Options{Workers: 1})
	wc := c.ForWorker(0)
	wc.BindStats(NewStats(st, "pend", 1))
	ctx, cancel := context.WithCancel(context.Background())
	waiting := make(chan error, 1)
	go func() {
		_, err := wc.Acquire(ctx)
		waiting <- err
	}()
	waitFor(t, 5*time.Second, "the first request never started to connect", func() bool {
		return c.Status().Breakers.PendingRequests == 1
	})
	start := time.Now()
	_, err = wc.Acquire(context.Background())
	var oe *OverflowError
	if !errors.As(err, &oe) || oe.Limit != "max_pending_requests" {
		t.Fatalf("second request: %v, want max_pending_requests overflow", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("refused after %v, want at once", d)
	}
	if n := st.Counter("cluster.pend.upstream_rq_pending_overflow").Value(); n != 1 {
		t.Errorf("upstream_rq_pending_overflow = %d, want 1", n)
	}
	cancel()
	if err := <-waiting; err == nil {
		t.Error("the connect to a full accept queue succeeded")
	}
	if s := c.Status().Breakers; s.PendingRequests != 0 || s.Requests != 0 || s.Connections != 0 {
		t.Errorf("breakers leak: %+v", s)
	}
}

// TestDialTCPMaxConnections: a TCP listener's upstream connections count
// against max_connections too, and Close gives the slot back once.
func TestDialTCPMaxConnections(t *testing.T) {
	be := newBackend(t, "b", nil)
	for _, withStats := range []bool{false, true} {
		cfg := config.Config{Clusters: []config.Cluster{{Name: "tcp", Endpoints: addrs(be),
			CircuitBreakers: &config.CircuitBreakers{MaxConnections: 1}}}}
		cfg.SetDefaults()
		c, err := NewCluster(cfg.Clusters[0])
		if err != nil {
			t.Fatal(err)
		}
		wc := c.ForWorker(0)
		var st *stats.Store
		if withStats {
			st, _ = stats.New(stats.Options{Workers: 1})
			wc.BindStats(NewStats(st, "tcp", 1))
		}
		up, _, done, err := wc.DialTCP(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var oe *OverflowError
		if _, _, _, err := wc.DialTCP(context.Background()); !errors.As(err, &oe) || oe.Limit != "max_connections" {
			t.Fatalf("stats %v: second connection: %v, want max_connections overflow", withStats, err)
		}
		up.Close()
		up.Close() // a second Close gives nothing back twice
		done()
		if n := c.Status().Breakers.Connections; n != 0 {
			t.Fatalf("stats %v: %d connections counted after Close", withStats, n)
		}
		up2, _, done2, err := wc.DialTCP(context.Background())
		if err != nil {
			t.Fatalf("stats %v: after Close: %v", withStats, err)
		}
		up2.Close()
		done2()
		if withStats && st.Counter("cluster.tcp.upstream_cx_overflow").Value() != 1 {
			t.Errorf("upstream_cx_overflow not counted")
		}
	}
}

// TestReportStatusCountsOnly5xxAndFailures: 2xx-4xx and 101 reset the
// run of failures; 5xx and failures after connect (status 0) extend it.
func TestReportStatusCountsOnly5xxAndFailures(t *testing.T) {
	cfg := config.Config{Clusters: []config.Cluster{{Name: "r", Endpoints: []string{"127.0.0.1:1"},
		OutlierDetection: &config.OutlierDetection{Consecutive5xx: new(100)}}}}
	cfg.SetDefaults()
	c, err := NewCluster(cfg.Clusters[0])
	if err != nil {
		t.Fatal(err)
	}
	wc := c.ForWorker(0)
	for _, tc := range []struct {
		status int
		want   int32
	}{{500, 1}, {0, 2}, {503, 3}, {101, 0}, {502, 1}, {404, 0}, {504, 1}, {200, 0}} {
		wc.ReportStatus(0, tc.status)
		if got := c.state.shared[0].consecutive5xx.Load(); got != tc.want {
			t.Fatalf("after %d: %d failures in a row, want %d", tc.status, got, tc.want)
		}
	}
	if e := c.Status().Endpoints[0]; e.Rq5xx != 5 || e.RqTotal != 7 { // the failure after connect has no response
		t.Errorf("rq_5xx %d rq_total %d, want 5 and 7", e.Rq5xx, e.RqTotal)
	}
}
