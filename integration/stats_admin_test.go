package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// statsFlush is the [stats] flush_interval of the stats tests: short, so
// that histograms show quickly.
const statsFlush = 100 * time.Millisecond

// statsBaseID hands out a base-id per stats test: far from the ids people
// use and from those of other test binaries running at once.
var statsBaseID atomic.Int64

func init() { statsBaseID.Store(1<<29 + int64(os.Getpid())<<6) }

// statsRegion is a test's own stats region: a base-id and a region file
// in its temporary directory (never the /dev/shm default).
type statsRegion struct {
	BaseID int64
	Path   string
}

func newStatsRegion(t *testing.T) statsRegion {
	t.Helper()
	return statsRegion{BaseID: statsBaseID.Add(1), Path: filepath.Join(t.TempDir(), "hotproxy.stats")}
}

// config sets the region in c (through Extra).
func (r statsRegion) config(c harness.Config) harness.Config {
	c.Extra += fmt.Sprintf("[stats]\npath = %q\nflush_interval = %q\n", r.Path, statsFlush.String())
	return c
}

// args are the serve flags that select the region's base-id.
func (r statsRegion) args() []string { return []string{"--base-id", strconv.FormatInt(r.BaseID, 10)} }

// start starts a proxy on the region.
func (r statsRegion) start(t *testing.T, c harness.Config) *harness.Proxy {
	t.Helper()
	return harness.Start(t, r.config(c), r.args()...)
}

// statValues is GET /stats?format=json by name: counters, gauges, and
// histograms as their sample count.
type statValues map[string]int64

func getStats(t *testing.T, p *harness.Proxy) statValues {
	t.Helper()
	code, body := p.AdminGet("/stats?format=json")
	if code != http.StatusOK {
		t.Fatalf("GET /stats?format=json: %d %s", code, body)
	}
	var doc struct {
		Stats []struct {
			Name      string  `json:"name"`
			Kind      string  `json:"kind"`
			Counter   *uint64 `json:"counter"`
			Value     *int64  `json:"value"`
			Histogram *struct {
				Count uint64 `json:"count"`
			} `json:"histogram"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("/stats?format=json is not JSON: %v\n%s", err, body)
	}
	v := statValues{}
	for _, st := range doc.Stats {
		switch {
		case st.Counter != nil:
			v[st.Name] = int64(*st.Counter)
		case st.Value != nil:
			v[st.Name] = *st.Value
		case st.Histogram != nil:
			v[st.Name] = int64(st.Histogram.Count)
		}
	}
	return v
}

// waitStat polls /stats until name has the value want.
func waitStat(t *testing.T, p *harness.Proxy, name string, want int64, timeout time.Duration) statValues {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := getStats(t, p)
		if v[name] == want {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d after %v, want %d", name, v[name], timeout, want)
		}
		time.Sleep(statsFlush / 2)
	}
}

// runLoad sends n requests through p's listener "web" and fails the test
// unless every one of them succeeded.
func runLoad(t *testing.T, p *harness.Proxy, n int, mode loadgen.Mode) loadgen.Result {
	t.Helper()
	res, err := loadgen.Do(context.Background(), loadgen.Options{
		URL: p.URL("web", "/"), Mode: mode, Clients: 4, Requests: n, Duration: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() != 0 || res.OK() != int64(n) {
		t.Fatalf("load: %d OK of %d, want every one: %s", res.OK(), n, res)
	}
	return res
}

// wantRequests checks the listener's request counters against ok requests
// answered 200 (allowing for requests the client's transport retried,
// which the proxy may have seen twice).
func wantRequests(t *testing.T, v statValues, ok int64, retried int64) {
	t.Helper()
	for _, name := range []string{"listener.web.downstream_rq_total", "listener.web.downstream_rq_2xx"} {
		if got := v[name]; got < ok || got > ok+retried {
			t.Errorf("%s = %d, want %d (the load generator's OK count; %d retried)", name, got, ok, retried)
		}
	}
	for _, name := range []string{"listener.web.downstream_rq_4xx", "listener.web.downstream_rq_5xx"} {
		if got := v[name]; got != 0 {
			t.Errorf("%s = %d, want 0", name, got)
		}
	}
}

// TestStatsAdmin runs load through a proxy and checks what GET /stats and
// GET /stats/prometheus say about it.
func TestStatsAdmin(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	reg := newStatsRegion(t)
	p := reg.start(t, httpProxyConfig(b.Addr))

	const n = 400
	res := runLoad(t, p, n, loadgen.KeepAlive)
	// Counters are written at request time: no flush to wait for.
	v := getStats(t, p)
	wantRequests(t, v, res.OK(), res.Retried)
	if cx, w0, w1 := v["listener.web.downstream_cx_total"], v["worker.0.downstream_cx_total"], v["worker.1.downstream_cx_total"]; cx < 1 || cx > n || w0+w1 != cx {
		t.Errorf("downstream_cx_total %d, per worker %d + %d", cx, w0, w1)
	}
	if v["listener.web.downstream_cx_rx_bytes_total"] < n*10 || v["listener.web.downstream_cx_tx_bytes_total"] < n*10 {
		t.Errorf("bytes rx %d tx %d for %d requests", v["listener.web.downstream_cx_rx_bytes_total"], v["listener.web.downstream_cx_tx_bytes_total"], n)
	}
	if got := v["cluster.backend.upstream_rq_total"]; got != v["listener.web.downstream_rq_total"] {
		t.Errorf("cluster.backend.upstream_rq_total = %d, downstream_rq_total %d", got, v["listener.web.downstream_rq_total"])
	}
	if cx := v["cluster.backend.upstream_cx_total"]; cx < 1 || cx > n {
		t.Errorf("cluster.backend.upstream_cx_total = %d", cx)
	}
	if act := v["cluster.backend.upstream_cx_active"]; act < 0 || act > v["cluster.backend.upstream_cx_total"] {
		t.Errorf("cluster.backend.upstream_cx_active = %d", act)
	}
	for name, want := range map[string]int64{
		"cluster.backend.upstream_cx_connect_fail": 0,
		"cluster.backend.membership_total":         1,
		"cluster.backend.membership_healthy":       1,
		"server.live":                              1,
		"server.state":                             0,
		"server.concurrency":                       testConcurrency,
		"server.hot_restart_epoch":                 0,
	} {
		if got, ok := v[name]; !ok || got != want {
			t.Errorf("%s = %d (present: %v), want %d", name, got, ok, want)
		}
	}
	// Histograms reach the region at the next flush.
	v = waitStat(t, p, "listener.web.downstream_rq_time", v["listener.web.downstream_rq_total"], 5*time.Second)
	if got := v["cluster.backend.upstream_rq_time"]; got != v["cluster.backend.upstream_rq_total"] {
		t.Errorf("cluster.backend.upstream_rq_time count %d, upstream_rq_total %d", got, v["cluster.backend.upstream_rq_total"])
	}
	if v["server.memory_allocated"] <= 0 {
		t.Errorf("server.memory_allocated = %d", v["server.memory_allocated"])
	}

	t.Run("text", func(t *testing.T) {
		code, body := p.AdminGet("/stats")
		if code != http.StatusOK {
			t.Fatalf("GET /stats: %d %s", code, body)
		}
		wantContains(t, "/stats", string(body),
			fmt.Sprintf("listener.web.downstream_rq_total: %d\n", v["listener.web.downstream_rq_total"]),
			"server.live: 1\n", "listener.web.downstream_rq_time: count=")
		line := regexp.MustCompile(`^[^\s:]+: \S`)
		for _, l := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
			if !line.MatchString(l) {
				t.Errorf("/stats line %q is not \"name: value\"", l)
			}
		}
	})
	t.Run("filter and usedonly", func(t *testing.T) {
		code, body := p.AdminGet(`/stats?filter=^cluster\.backend\.upstream_rq_total$`)
		if want := fmt.Sprintf("cluster.backend.upstream_rq_total: %d\n", v["cluster.backend.upstream_rq_total"]); code != 200 || string(body) != want {
			t.Errorf("filtered: %d %q, want %q", code, body, want)
		}
		code, body = p.AdminGet("/stats?usedonly")
		if code != 200 || strings.Contains(string(body), "downstream_rq_5xx") || !strings.Contains(string(body), "downstream_rq_2xx") {
			t.Errorf("usedonly: %d\n%s", code, body)
		}
		code, body = p.AdminGet("/stats?filter=a(b")
		if code != http.StatusBadRequest || !strings.Contains(string(body), `"a(b"`) {
			t.Errorf("bad regex: %d %q, want 400 naming it", code, body)
		}
	})
	t.Run("prometheus", func(t *testing.T) {
		code, body := p.AdminGet("/stats/prometheus")
		if code != http.StatusOK {
			t.Fatalf("GET /stats/prometheus: %d %s", code, body)
		}
		samples := parsePrometheus(t, body)
		if got := samples[`hotproxy_listener_downstream_rq_total{listener="web"}`]; got != float64(v["listener.web.downstream_rq_total"]) {
			t.Errorf(`hotproxy_listener_downstream_rq_total{listener="web"} %v, want %d`, got, v["listener.web.downstream_rq_total"])
		}
		if samples[`hotproxy_listener_downstream_rq_time_seconds_count{listener="web"}`] == 0 || samples["hotproxy_server_live"] != 1 {
			t.Errorf("rq_time_count %v, server_live %v", samples[`hotproxy_listener_downstream_rq_time_seconds_count{listener="web"}`], samples["hotproxy_server_live"])
		}
	})
}

// parsePrometheus parses the text exposition with Prometheus' own
// parser (which refuses what Prometheus would refuse) and returns each
// sample by name{labels} in the parser's order of labels, e.g.
// hotproxy_listener_downstream_rq_total{listener="web"}, and a
// histogram's _count and _sum under name_count{labels}, name_sum{labels}.
func parsePrometheus(t *testing.T, body []byte) map[string]float64 {
	t.Helper()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the Prometheus text parser refuses the scrape: %v\n%s", err, body)
	}
	out := map[string]float64{}
	for name, f := range fams {
		if f.GetHelp() == "" {
			t.Errorf("family %s has no # HELP", name)
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := ""
			if len(ls) > 0 {
				key = "{" + strings.Join(ls, ",") + "}"
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[name+key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name+key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"+key] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+key] = m.GetHistogram().GetSampleSum()
			default:
				t.Errorf("family %s has no # TYPE", name)
			}
		}
	}
	if len(fams) < 10 {
		t.Errorf("only %d metric families:\n%s", len(fams), body)
	}
	return out
}
