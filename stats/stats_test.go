package stats

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/hashicorp/go-hclog"
	"github.com/hotproxy/hotproxy/shm"
)

func newStore(tb testing.TB, o Options) *Store {
	tb.Helper()
	s, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func smallRegion(tb testing.TB, lanes int, records int) *shm.Region {
	tb.Helper()
	r, err := shm.Open(shm.Options{
		Path: filepath.Join(tb.TempDir(), "stats"), Lanes: lanes, MaxOwners: 4, MaxLanes: 8,
		MaxRecords: records, StringBytes: 1 << 16, ValueBytes: 1 << 20,
	})
	if errors.Is(err, errors.ErrUnsupported) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

func find(tb testing.TB, snap *shm.Snapshot, name string) shm.Stat {
	tb.Helper()
	for _, st := range snap.Stats {
		if st.Name == name {
			return st
		}
	}
	tb.Fatalf("no stat %q", name)
	return shm.Stat{}
}

// TestBucketsMirrorVictoriaMetrics: every value lands in the bucket with
// the same vmrange label as metrics.Histogram gives it.
func TestBucketsMirrorVictoriaMetrics(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	vals := []float64{0, 1e-10, 1e-9, 1, 10, 1e3, 0.5, 123.456, 1e17, 9.99e17, 1e18, 1e20, math.Inf(1)}
	for i := 0; i < 20000; i++ {
		vals = append(vals, math.Pow(10, rng.Float64()*30-10))
	}
	for _, v := range vals {
		var h metrics.Histogram
		h.Update(v)
		var want string
		h.VisitNonZeroBuckets(func(vmrange string, _ uint64) { want = vmrange })
		if got := VMRange(BucketIndex(v)); got != want {
			t.Fatalf("value %g: bucket %q, metrics.Histogram says %q", v, got, want)
		}
	}
	if BucketIndex(-1) != -1 || BucketIndex(math.NaN()) != -1 {
		t.Fatal("negative or NaN not ignored")
	}
}

func TestStoreInProcess(t *testing.T) {
	s := newStore(t, Options{Workers: 2})
	c := s.Counter("listener.web.downstream_cx_total")
	if s.Counter("listener.web.downstream_cx_total") != c {
		t.Fatal("same name, different counter")
	}
	var wg sync.WaitGroup
	for l := 0; l < s.Lanes(); l++ {
		wg.Add(1)
		go func(h CounterLane) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Inc()
			}
		}(c.Lane(l))
	}
	wg.Wait()
	g := s.Gauge("cx_active", GaugeSum)
	g.Lane(1).Inc()
	g.Lane(1).Inc()
	g.Lane(2).Dec()
	h := s.Histogram("rq_time")
	h.Lane(1).Record(0.001)
	h.Lane(2).Record(0.002)
	h.Lane(2).Record(-1)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	h.Lane(0).Record(5) // next interval
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := find(t, snap, "listener.web.downstream_cx_total").Counter; v != 3000 {
		t.Fatalf("counter %d", v)
	}
	if v := find(t, snap, "cx_active").Gauge; v != 1 {
		t.Fatalf("gauge %d", v)
	}
	hv := find(t, snap, "rq_time").Histogram
	if hv.Count != 2 || math.Abs(hv.Sum-0.003) > 1e-12 {
		t.Fatalf("histogram %+v", hv)
	}
	s.Flush()
	if v := h.Value(); v.Count != 3 {
		t.Fatalf("after second flush %+v", v.Count)
	}
}

func TestScopeRemove(t *testing.T) {
	s := newStore(t, Options{})
	sc := s.Scope("cluster.a")
	sc.Counter("rq_total").Lane(0).Inc()
	sc.Scope("lb").Gauge("healthy", GaugeSum).Lane(0).Add(3)
	s.Counter("cluster.ab.rq_total").Lane(0).Inc()
	if err := sc.Remove(); err != nil {
		t.Fatal(err)
	}
	snap, _ := s.Snapshot()
	var names []string
	for _, st := range snap.Stats {
		names = append(names, st.Name)
	}
	if got := strings.Join(names, ","); got != "cluster.ab.rq_total,stats.overflow,stats.region_lost_writes,stats.region_truncated" {
		t.Fatalf("after remove: %s", got)
	}
}

func TestLaneCache(t *testing.T) {
	s := newStore(t, Options{Workers: 2})
	var wg sync.WaitGroup
	for w := 1; w <= 2; w++ {
		c := s.Cache(w)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 500; i++ {
					c.Counter(fmt.Sprintf("dyn.%d", i%7)).Inc()
					c.Gauge("dyn.g", GaugeSum).Inc()
					c.Histogram("dyn.h").Record(1)
				}
			}()
		}
	}
	wg.Wait()
	var total uint64
	for i := 0; i < 7; i++ {
		total += s.Counter(fmt.Sprintf("dyn.%d", i)).Value()
	}
	if total != 2*4*500 || s.Gauge("dyn.g", GaugeSum).Value() != 4000 {
		t.Fatalf("total %d", total)
	}
	allocs := testing.AllocsPerRun(100, func() { s.Cache(1).Counter("dyn.1") })
	_ = allocs
	c := s.Cache(1)
	c.Counter("dyn.1")
	if a := testing.AllocsPerRun(100, func() { c.Counter("dyn.1").Inc() }); a != 0 {
		t.Fatalf("cache hit allocates %v", a)
	}
}

func TestOverflow(t *testing.T) {
	region := smallRegion(t, 2, 4)
	var logbuf bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logbuf, Level: hclog.Warn})
	s := newStore(t, Options{Region: region, Workers: 1, Logger: log})
	a := s.Counter("a")   // record 4 (stats.overflow, stats.region_truncated and _lost_writes are 1-3)
	b := s.Counter("b")   // full
	c := s.Gauge("c", 0)  // full
	h := s.Histogram("h") // full
	a.Lane(1).Add(2)
	b.Lane(1).Add(5)
	c.Lane(0).Set(7)
	h.Lane(1).Record(3)
	s.Flush()
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if find(t, snap, "a").Counter != 2 || find(t, snap, "b").Counter != 5 || find(t, snap, "c").Gauge != 7 ||
		find(t, snap, "h").Histogram.Count != 1 {
		t.Fatalf("%+v", snap.Stats)
	}
	if v := find(t, snap, OverflowCounter).Counter; v != 3 {
		t.Fatalf("overflow = %d", v)
	}
	if n := strings.Count(logbuf.String(), "[WARN]"); n != 1 {
		t.Fatalf("%d warnings:\n%s", n, logbuf.String())
	}
	if _, err := New(Options{Region: region, Workers: 5}); err == nil {
		t.Fatal("store with more lanes than the region accepted")
	}
}

func TestExposition(t *testing.T) {
	s := newStore(t, Options{})
	s.Counter("listener.web.downstream_cx_total").Lane(0).Add(12)
	s.Counter("zero").Lane(0).Add(0)
	s.Gauge("server.live", GaugeNewest).Lane(0).Set(1)
	s.Gauge("neg-gauge/x", GaugeSum).Lane(0).Add(-2)
	s.Counter("9lives").Lane(0).Inc()
	h := s.Histogram("http.rq_time")
	vm := metrics.NewSet()
	vh := vm.NewHistogram("http_rq_time")
	for _, v := range []float64{0.001, 0.002, 0.25, 3, 3} {
		h.Lane(0).Record(v)
		vh.Update(v)
	}
	s.Flush()
	snap, _ := s.Snapshot()

	var text bytes.Buffer
	WriteText(&text, snap, ExposeOptions{UsedOnly: true, Filter: regexp.MustCompile(`^[^s]`)})
	wantText := "9lives: 1\nhttp.rq_time: count=5 sum=6.253"
	if !strings.HasPrefix(text.String(), wantText) || strings.Contains(text.String(), "zero") ||
		!strings.Contains(text.String(), "listener.web.downstream_cx_total: 12\nneg-gauge/x: -2\n") {
		t.Fatalf("text:\n%s", text.String())
	}

	var js bytes.Buffer
	if err := WriteJSON(&js, snap, ExposeOptions{}); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, js.String())
	}

	var prom bytes.Buffer
	WritePrometheus(&prom, snap, ExposeOptions{})
	out := prom.String()
	for _, want := range []string{
		"# TYPE hotproxy_listener_downstream_cx_total counter\nhotproxy_listener_downstream_cx_total{listener=\"web\"} 12\n",
		"# TYPE hotproxy_server_live gauge\nhotproxy_server_live 1\n",
		"hotproxy_neg_gauge_x -2\n",
		"hotproxy__9lives_total 1\n",
		"# TYPE hotproxy_http_rq_time histogram\n",
		"hotproxy_http_rq_time_bucket{le=\"+Inf\"} 5\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("prometheus output lacks %q:\n%s", want, out)
		}
	}
	// In the vmrange form, the bucket lines are exactly what
	// metrics.Histogram writes (an unknown histogram keeps its unit).
	var vmrange bytes.Buffer
	WritePrometheusVMRange(&vmrange, snap, ExposeOptions{})
	var vmOut bytes.Buffer
	vm.WritePrometheus(&vmOut)
	for _, line := range strings.Split(strings.TrimSpace(vmOut.String()), "\n") {
		if !strings.Contains(line, "_bucket{") {
			continue
		}
		if !strings.Contains(vmrange.String(), "hotproxy_"+line+"\n") {
			t.Fatalf("line %q of metrics.Histogram missing from:\n%s", line, vmrange.String())
		}
	}
}

func TestPackageDoc(t *testing.T) {
	data, err := os.ReadFile("doc.go")
	if err != nil || !strings.Contains(string(data), "// Package stats ") {
		t.Fatal("stats has no package doc comment in doc.go")
	}
}

// TestHistogramFlushWhileRecording: flips and merges racing with records
// lose nothing and count nothing twice.
func TestHistogramFlushWhileRecording(t *testing.T) {
	region := smallRegion(t, 3, 16)
	s := newStore(t, Options{Region: region, Workers: 2})
	h := s.Histogram("h")
	const per = 20000
	var wg sync.WaitGroup
	for l := 1; l <= 2; l++ {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func(hl *HistogramLane) {
				defer wg.Done()
				for i := 0; i < per; i++ {
					hl.Record(0.5)
				}
			}(h.Lane(l))
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for flushing := true; flushing; {
		select {
		case <-done:
			flushing = false
		default:
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	s.Flush()
	snap, err := region.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	hv := find(t, snap, "h").Histogram
	if hv.Count != 4*per || hv.Sum != 0.5*4*per || hv.Buckets[BucketIndex(0.5)] != 4*per {
		t.Fatalf("count %d sum %g", hv.Count, hv.Sum)
	}
}
