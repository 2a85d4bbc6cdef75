package workers

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/stats"
)

// TestStatsHTTPProxy: the listener, worker and cluster stats of proxied
// requests, and the histograms after a flush.
func TestStatsHTTPProxy(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer be.Close()
	m := startManager(t, proxyConfig(hostOf(be.URL)), 2)
	c := newClient(t)
	const n = 9
	for range n {
		if resp, _ := get(t, c, "http://"+addr(t, m, "web")+"/"); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for name, want := range map[string]uint64{
		"listener.web.downstream_rq_total":  n,
		"listener.web.downstream_rq_2xx":    n,
		"cluster.backend.upstream_rq_total": n,
	} {
		if got := counter(m, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if cx := counter(m, "cluster.backend.upstream_cx_total"); cx < 1 || cx > n {
		t.Errorf("upstream_cx_total %d", cx)
	}
	if cx, act := counter(m, "cluster.backend.upstream_cx_total"), gauge(m, "cluster.backend.upstream_cx_active"); act < 1 || uint64(act) > cx {
		t.Errorf("upstream_cx_active %d of %d opened", act, cx)
	}
	if got := m.Stats().Gauge("cluster.backend.membership_total", stats.GaugeNewest).Value(); got != 1 {
		t.Errorf("membership_total %d, want 1", got)
	}
	// A request's time is recorded once its last byte is written, which
	// the client may read first.
	waitFor(t, 5*time.Second, "requests to finish", func() bool { return gauge(m, "listener.web.downstream_rq_active") == 0 })
	if err := m.Stats().Flush(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"listener.web.downstream_rq_time", "cluster.backend.upstream_rq_time"} {
		if h := m.Stats().Histogram(name).Value(); h.Count != n || h.Sum <= 0 {
			t.Errorf("%s: count %d sum %g, want %d samples", name, h.Count, h.Sum, n)
		}
	}
	// Closing the pools closes the upstream connections: the gauge follows.
	c.CloseIdleConnections()
	waitFor(t, 5*time.Second, "downstream connections to close", func() bool { return cxActive(m) == 0 })
	m.snap.closeIdle()
	waitFor(t, 5*time.Second, "upstream_cx_active to reach 0", func() bool { return gauge(m, "cluster.backend.upstream_cx_active") == 0 })
	if cx, destroyed := lstat(m, statCxTotal), lstat(m, statCxDestroy); cx != destroyed {
		t.Errorf("downstream_cx_total %d, downstream_cx_destroy %d after every connection closed", cx, destroyed)
	}
}

// TestStatsConnectFail: an endpoint that refuses counts in
// upstream_cx_connect_fail, and the client's 503 in downstream_rq_5xx.
func TestStatsConnectFail(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	m := startManager(t, proxyConfig(dead), 1)
	resp, _ := get(t, newClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if got := counter(m, "cluster.backend.upstream_cx_connect_fail"); got != 1 {
		t.Errorf("upstream_cx_connect_fail %d, want 1", got)
	}
	if got := counter(m, "cluster.backend.upstream_cx_total"); got != 0 {
		t.Errorf("upstream_cx_total %d, want 0", got)
	}
	if got := lstat(m, "downstream_rq_5xx"); got != 1 {
		t.Errorf("downstream_rq_5xx %d, want 1", got)
	}
}

// TestStatsStoreLanes: a store with too few lanes for the workers is
// refused, naming what is needed.
func TestStatsStoreLanes(t *testing.T) {
	st, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := directConfig("x")
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := New(Options{Concurrency: 2, Stats: st}, snap); err == nil {
		m.Close()
		t.Fatal("New accepted a store with 2 lanes for 2 workers")
	}
}
