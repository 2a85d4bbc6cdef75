package stats

import (
	"bytes"
	"math"
	"math/rand"
	"regexp"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/hotproxy/hotproxy/shm"
)

// parseProm parses a scrape with the Prometheus text parser; a scrape it
// refuses fails the test.
func parseProm(tb testing.TB, text string) map[string]*dto.MetricFamily {
	tb.Helper()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		tb.Fatalf("the Prometheus text parser refuses the scrape: %v\n%s", err, text)
	}
	return fams
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// seriesWith returns the metric of fam whose labels include want.
func seriesWith(tb testing.TB, fam *dto.MetricFamily, want map[string]string) *dto.Metric {
	tb.Helper()
	for _, m := range fam.GetMetric() {
		got := labelsOf(m)
		ok := true
		for k, v := range want {
			ok = ok && got[k] == v
		}
		if ok {
			return m
		}
	}
	tb.Fatalf("family %s has no series with labels %v", fam.GetName(), want)
	return nil
}

// promQuantile is Prometheus' histogram_quantile over classic buckets
// (linear interpolation inside the bucket holding the rank, the first
// bucket's lower bound 0, a rank in +Inf answered with the highest bound).
func promQuantile(q float64, h *dto.Histogram) float64 {
	bs := h.GetBucket()
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for _, b := range bs {
		c := float64(b.GetCumulativeCount())
		if c >= rank {
			if math.IsInf(b.GetUpperBound(), 1) {
				return prevBound
			}
			return prevBound + (b.GetUpperBound()-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = b.GetUpperBound(), c
	}
	return prevBound
}

// TestPrometheusScrapeParses writes a snapshot of real stats (a store
// whose histograms record milliseconds, as the proxy's do) and parses it
// with Prometheus' own text parser: every family has HELP and TYPE and
// the hotproxy_ prefix, counters end in _total, listener and cluster are
// labels (a name with dots too), times are in seconds, and the le buckets
// hold exactly the samples at or under each bound, so that
// histogram_quantile gives the latency per listener and per cluster.
func TestPrometheusScrapeParses(t *testing.T) {
	s := newStore(t, Options{})
	s.Counter("listener.web.downstream_rq_total").Lane(0).Add(2000)
	s.Counter("listener.api.v2.downstream_rq_total").Lane(0).Add(3)
	s.Counter("cluster.backend.upstream_rq_retry").Lane(0).Add(4)
	s.Counter("cluster.backend.ssl.handshake").Lane(0).Add(5)
	s.Counter("worker.1.downstream_cx_total").Lane(0).Add(6)
	s.Counter("listener.web.downstream_cx_rx_bytes_total").Lane(0).Add(7)
	s.Gauge("server.live", GaugeNewest).Lane(0).Set(1)
	s.Gauge("server.uptime", GaugeNewest).Lane(0).Set(42)
	s.Gauge("server.memory_allocated", GaugeNewest).Lane(0).Set(1 << 20)
	s.Counter("some.future_stat").Lane(0).Add(1)
	// Bytes a foreign writer of the region could have left in a name.
	s.Counter("listener.we\"ird\\na\nme\xff.downstream_rq_total").Lane(0).Add(9)

	rng := rand.New(rand.NewSource(26))
	var webMS, backendMS []float64
	lh, ch := s.Histogram("listener.web.downstream_rq_time"), s.Histogram("cluster.backend.upstream_rq_time")
	for i := 0; i < 2000; i++ {
		v := math.Pow(10, rng.Float64()*4-1.5) // 0.03 ms .. 300 ms, log-uniform
		webMS = append(webMS, v)
		lh.Lane(0).Record(v)
		u := 5 + rng.Float64()*20 // 5 .. 25 ms
		backendMS = append(backendMS, u)
		ch.Lane(0).Record(u)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WritePrometheus(&out, snap, ExposeOptions{}); err != nil {
		t.Fatal(err)
	}
	fams := parseProm(t, out.String())

	for name, f := range fams {
		if !strings.HasPrefix(name, "hotproxy_") {
			t.Errorf("family %s: no hotproxy_ prefix", name)
		}
		if f.GetHelp() == "" {
			t.Errorf("family %s: no # HELP", name)
		}
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if f.GetType() == dto.MetricType_UNTYPED {
			t.Errorf("family %s has no # TYPE", name)
		}
	}
	counter := func(fam string, labels map[string]string) float64 {
		t.Helper()
		f := fams[fam]
		if f == nil {
			t.Fatalf("no family %s in\n%s", fam, out.String())
		}
		return seriesWith(t, f, labels).GetCounter().GetValue()
	}
	gauge := func(fam string) float64 {
		t.Helper()
		f := fams[fam]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("no single-series family %s in\n%s", fam, out.String())
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	for _, c := range []struct {
		fam    string
		labels map[string]string
		want   float64
	}{
		{"hotproxy_listener_downstream_rq_total", map[string]string{"listener": "web"}, 2000},
		{"hotproxy_listener_downstream_rq_total", map[string]string{"listener": "api.v2"}, 3},
		{"hotproxy_listener_downstream_rq_total", map[string]string{"listener": "we\"ird\\na\nme\uFFFD"}, 9},
		{"hotproxy_cluster_upstream_rq_retry_total", map[string]string{"cluster": "backend"}, 4},
		{"hotproxy_cluster_ssl_handshake_total", map[string]string{"cluster": "backend"}, 5},
		{"hotproxy_worker_downstream_cx_total", map[string]string{"worker": "1"}, 6},
		{"hotproxy_listener_downstream_cx_rx_bytes_total", map[string]string{"listener": "web"}, 7},
		{"hotproxy_some_future_stat_total", nil, 1},
	} {
		if got := counter(c.fam, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.fam, c.labels, got, c.want)
		}
	}
	if gauge("hotproxy_server_live") != 1 || gauge("hotproxy_server_uptime_seconds") != 42 || gauge("hotproxy_server_memory_allocated_bytes") != 1<<20 {
		t.Errorf("server gauges wrong:\n%s", out.String())
	}

	for _, c := range []struct {
		fam, label, value string
		ms                []float64
	}{
		{"hotproxy_listener_downstream_rq_time_seconds", "listener", "web", webMS},
		{"hotproxy_cluster_upstream_rq_time_seconds", "cluster", "backend", backendMS},
	} {
		f := fams[c.fam]
		if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("no histogram family %s in\n%s", c.fam, out.String())
		}
		h := seriesWith(t, f, map[string]string{c.label: c.value}).GetHistogram()
		if h.GetSampleCount() != uint64(len(c.ms)) {
			t.Errorf("%s count %d, want %d", c.fam, h.GetSampleCount(), len(c.ms))
		}
		var sum float64
		for _, v := range c.ms {
			sum += v / 1000
		}
		if math.Abs(h.GetSampleSum()-sum) > 1e-9*sum {
			t.Errorf("%s sum %g s, want %g s", c.fam, h.GetSampleSum(), sum)
		}
		// Exact: each bucket holds the samples at or under its bound.
		for _, b := range h.GetBucket() {
			var want uint64
			for _, v := range c.ms {
				if v/1000 <= b.GetUpperBound() {
					want++
				}
			}
			if b.GetCumulativeCount() != want {
				t.Errorf("%s le=%g: %d, want %d (the samples at or under it)", c.fam, b.GetUpperBound(), b.GetCumulativeCount(), want)
			}
		}
		sorted := append([]float64(nil), c.ms...)
		sort.Float64s(sorted)
		for _, q := range []float64{0.5, 0.9, 0.99} {
			got := promQuantile(q, h)
			truth := sorted[int(q*float64(len(sorted)))] / 1000
			// Within one bucket of the truth (a factor 10^(1/6)).
			if ratio := got / truth; ratio < 1/1.47 || ratio > 1.47 {
				t.Errorf("%s{%s=%q} histogram_quantile(%g) = %gs, true quantile %gs", c.fam, c.label, c.value, q, got, truth)
			}
			t.Logf("histogram_quantile(%g, %s{%s=%q}) = %.6fs (true %.6fs)", q, c.fam, c.label, c.value, got, truth)
		}
	}
}

// TestPrometheusGenerations: the owner table is exposed as
// hotproxy_generation_* series labelled by slot, pid and epoch, alive 1
// for a live owner and 0 for a dead one.
func TestPrometheusGenerations(t *testing.T) {
	snap := &shm.Snapshot{Owners: []shm.Owner{
		{Slot: 0, State: shm.OwnerDead, PID: 100, Epoch: 3},
		{Slot: 1, State: shm.OwnerLive, PID: 101, Epoch: 4},
	}}
	var out bytes.Buffer
	if err := WritePrometheus(&out, snap, ExposeOptions{}); err != nil {
		t.Fatal(err)
	}
	fams := parseProm(t, out.String())
	f := fams["hotproxy_generation_alive"]
	if f == nil {
		t.Fatalf("no hotproxy_generation_alive:\n%s", out.String())
	}
	if v := seriesWith(t, f, map[string]string{"pid": "100", "epoch": "3", "slot": "0"}).GetGauge().GetValue(); v != 0 {
		t.Errorf("dead generation alive = %g, want 0", v)
	}
	if v := seriesWith(t, f, map[string]string{"pid": "101", "epoch": "4", "slot": "1"}).GetGauge().GetValue(); v != 1 {
		t.Errorf("live generation alive = %g, want 1", v)
	}
}

// TestPrometheusCollisions: stats that sanitise to one series are all
// kept, under distinct families, and the parser accepts the result.
func TestPrometheusCollisions(t *testing.T) {
	s := newStore(t, Options{})
	s.Counter("a.b").Lane(0).Add(1)
	s.Counter("a_b").Lane(0).Add(2)
	s.Counter("a_b_total").Lane(0).Add(3)
	s.Gauge("a-b", GaugeSum).Lane(0).Set(4)
	snap, _ := s.Snapshot()
	var out bytes.Buffer
	WritePrometheus(&out, snap, ExposeOptions{Filter: regexp.MustCompile(`^a`)})
	fams := parseProm(t, out.String())
	var values []float64
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			values = append(values, m.GetCounter().GetValue()+m.GetGauge().GetValue())
		}
	}
	sort.Float64s(values)
	if len(values) != 4 || values[0] != 1 || values[3] != 4 {
		t.Fatalf("values %v, want 1..4 each once:\n%s", values, out.String())
	}
}

// TestCumulativeLEExactAtBounds: a sample exactly at a bound is counted
// under it, one just above it is not.
func TestCumulativeLEExactAtBounds(t *testing.T) {
	for k := promMinK; k <= promMaxK; k++ {
		boundMS := bucketUpper[storedUpper(k, 3)]
		if r := boundMS / 1000 / promBound(k); math.Abs(r-1) > 1e-12 {
			t.Fatalf("k=%d: stored bound %g ms is not le %g s", k, boundMS, promBound(k))
		}
		b := make([]uint64, NumBuckets)
		b[BucketIndex(boundMS)]++
		b[BucketIndex(math.Nextafter(boundMS, math.Inf(1)))]++
		cum := cumulativeLE(b, 3)
		i := k - promMinK
		if cum[i] != 1 || cum[len(cum)-1] != 2 {
			t.Fatalf("k=%d le=%g: cumulative %d (total %d), want 1 (2)", k, promBound(k), cum[i], cum[len(cum)-1])
		}
	}
}
