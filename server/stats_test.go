package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// isolateStats gives cfg a stats region and a restart-socket directory
// of its own in temporary directories, so that tests never share one,
// touch /dev/shm, or meet a real generation's restart socket.
func isolateStats(tb testing.TB, cfg *config.Config) string {
	tb.Helper()
	cfg.Stats.Path = filepath.Join(tb.TempDir(), "hotproxy.stats")
	// The restart socket too: every test server is base-id 0, epoch 0,
	// whose abstract name a real generation on this machine (make run)
	// may hold. A private directory of the test's own is nobody else's.
	if cfg.HotRestart.SocketDir == "" {
		cfg.HotRestart.SocketDir = tb.TempDir()
	}
	return cfg.Stats.Path
}

// statsJSON GETs /stats?format=json and returns the values by name
// (counters and gauges; histograms as their count).
func statsJSON(tb testing.TB, adminURL string) map[string]int64 {
	tb.Helper()
	code, body := get(tb, adminURL+"/stats?format=json")
	if code != http.StatusOK {
		tb.Fatalf("GET /stats?format=json: %d %s", code, body)
	}
	var doc struct {
		Stats []struct {
			Name      string  `json:"name"`
			Counter   *uint64 `json:"counter"`
			Value     *int64  `json:"value"`
			Histogram *struct {
				Count uint64 `json:"count"`
			} `json:"histogram"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		tb.Fatalf("/stats?format=json: %v\n%s", err, body)
	}
	out := map[string]int64{}
	for _, st := range doc.Stats {
		switch {
		case st.Counter != nil:
			out[st.Name] = int64(*st.Counter)
		case st.Value != nil:
			out[st.Name] = *st.Value
		case st.Histogram != nil:
			out[st.Name] = int64(st.Histogram.Count)
		}
	}
	return out
}

func TestStatsEndpoints(t *testing.T) {
	_, adminURL, webURL, _, _ := startServer(t)
	const n = 7
	for range n {
		if code, _ := get(t, webURL+"/"); code != 200 {
			t.Fatalf("status %d", code)
		}
	}
	got := statsJSON(t, adminURL)
	for name, want := range map[string]int64{
		"listener.web.downstream_rq_total": n,
		"listener.web.downstream_rq_2xx":   n,
		"listener.web.downstream_rq_4xx":   0,
		"server.live":                      1,
		"server.state":                     0,
		"server.concurrency":               2,
		"server.hot_restart_epoch":         0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %d (present %v), want %d", name, v, ok, want)
		}
	}
	if got["server.memory_allocated"] <= 0 {
		t.Errorf("server.memory_allocated = %d", got["server.memory_allocated"])
	}
	if w0, w1 := got["worker.0.downstream_cx_total"], got["worker.1.downstream_cx_total"]; w0+w1 != got["listener.web.downstream_cx_total"] || w0+w1 == 0 {
		t.Errorf("worker.*.downstream_cx_total %d + %d, listener %d", w0, w1, got["listener.web.downstream_cx_total"])
	}

	// Histograms reach the region at the next flush.
	deadline := time.Now().Add(5 * time.Second)
	for statsJSON(t, adminURL)["listener.web.downstream_rq_time"] != n {
		if time.Now().After(deadline) {
			t.Fatalf("listener.web.downstream_rq_time count never reached %d", n)
		}
		time.Sleep(50 * time.Millisecond)
	}

	code, body := get(t, adminURL+"/stats?filter=^listener\\.web\\.downstream_rq_2xx$")
	if code != 200 || body != fmt.Sprintf("listener.web.downstream_rq_2xx: %d\n", n) {
		t.Errorf("filtered /stats: %d %q", code, body)
	}
	code, body = get(t, adminURL+"/stats?usedonly")
	if code != 200 || strings.Contains(body, "downstream_rq_5xx") || !strings.Contains(body, "server.live: 1\n") {
		t.Errorf("/stats?usedonly: %d\n%s", code, body)
	}
	code, body = get(t, adminURL+"/stats?filter=(")
	if code != http.StatusBadRequest || !strings.Contains(body, `"("`) {
		t.Errorf("bad filter: %d %q", code, body)
	}
	code, body = get(t, adminURL+"/stats?format=xml")
	if code != http.StatusBadRequest || !strings.Contains(body, `"xml"`) {
		t.Errorf("bad format: %d %q", code, body)
	}
	code, body = get(t, adminURL+"/stats/prometheus")
	for _, want := range []string{
		"# TYPE hotproxy_listener_downstream_rq_total counter\n",
		fmt.Sprintf("hotproxy_listener_downstream_rq_total{listener=\"web\"} %d\n", n),
		"# TYPE hotproxy_server_live gauge\nhotproxy_server_live 1\n",
		"# TYPE hotproxy_listener_downstream_rq_time_seconds histogram\n",
		`hotproxy_listener_downstream_rq_time_seconds_bucket{listener="web",le="+Inf"}`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/stats/prometheus: %d, no %q in\n%s", code, want, body)
		}
	}
	code, body = get(t, adminURL+"/stats/prometheus?format=vmrange")
	if code != 200 || !strings.Contains(body, `hotproxy_listener_downstream_rq_time_seconds_bucket{listener="web",vmrange="`) || strings.Contains(body, `le="`) {
		t.Errorf("/stats/prometheus?format=vmrange: %d\n%s", code, body)
	}
	if code := post(t, adminURL+"/stats"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /stats: %d", code)
	}
}

// TestStatsRetireOnExit: when Run returns, the generation has left the
// region (its owner slot free) and its counters are in the retired totals.
func TestStatsRetireOnExit(t *testing.T) {
	srv, adminURL, webURL, done, _ := startServer(t)
	get(t, webURL+"/")
	path := srv.region.Path()
	post(t, adminURL+"/quitquitquit")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	r, err := shm.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snap, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range snap.Owners {
		if o.State != shm.OwnerFree {
			t.Errorf("owner left in the region: %+v", o)
		}
	}
	for _, st := range snap.Stats {
		if st.Name == "listener.web.downstream_rq_total" && st.Counter != 1 {
			t.Errorf("retired downstream_rq_total %d, want 1", st.Counter)
		}
		if st.Name == "server.live" && st.Gauge != 0 {
			t.Errorf("server.live %d after exit", st.Gauge)
		}
	}
}

// TestNewRefusesForeignRegion: a file at the stats path that is not a
// region stops New with an error naming it, and the file is not touched.
func TestNewRefusesForeignRegion(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "x" }
`, freeAddr(t))), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := isolateStats(t, cfg)
	garbage := bytes.Repeat([]byte("not a region "), 1000)
	if err := os.WriteFile(path, garbage, 0o640); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: cfg})
	if err == nil {
		srv.Close()
		t.Fatal("New succeeded on a foreign stats file")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
	after, rerr := os.ReadFile(path)
	if rerr != nil || !bytes.Equal(after, garbage) {
		t.Errorf("the foreign file was modified (%v)", rerr)
	}
	if errors.Is(err, os.ErrNotExist) {
		t.Errorf("unexpected error kind: %v", err)
	}
}

// TestStatsQuiet: the generation leaves the region only once nothing is in
// flight (every sum-mode *_active gauge of its own lanes is 0).
func TestStatsQuiet(t *testing.T) {
	srv, _, _, _, _ := startServer(t)
	busy := srv.stats.Gauge("test.conn_active", stats.GaugeSum).Lane(1)
	busy.Inc()
	if srv.statsQuiet(30 * time.Millisecond) {
		t.Fatal("quiet with a connection in flight")
	}
	busy.Dec()
	if !srv.statsQuiet(time.Second) {
		t.Fatal("not quiet with nothing in flight")
	}
}

// TestPeerRefusedCounted: peers the restart socket turns away are counted
// in server.hot_restart.peer_refused, one by one (their log lines are
// rate-limited; the count is not).
func TestPeerRefusedCounted(t *testing.T) {
	srv, admin, _, _, _ := startServer(t)
	const peers = 5
	for i := 0; i < peers; i++ {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: srv.hr.listener.Addr(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("not a hello"))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		c.Close()
		if err != nil || !strings.Contains(string(buf[:n]), `"type":"error"`) {
			t.Fatalf("peer %d: reply %q, %v; want an error message", i, buf[:n], err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var got int64
	for time.Now().Before(deadline) {
		got = statsJSON(t, admin)["server.hot_restart.peer_refused"]
		if got >= peers {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != peers {
		t.Fatalf("server.hot_restart.peer_refused = %d, want %d", got, peers)
	}
}
