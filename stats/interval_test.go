package stats

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

func TestHistogramDelta(t *testing.T) {
	prev := &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 10, Sum: 10}
	prev.Buckets[BucketIndex(1)] = 10
	cur := &shm.HistogramValue{Buckets: append([]uint64(nil), prev.Buckets...), Count: 15, Sum: 510}
	cur.Buckets[BucketIndex(100)] = 5
	d, ok := HistogramDelta(prev, cur)
	if !ok || d.Count != 5 || d.Sum != 500 || d.Buckets[BucketIndex(1)] != 0 || d.Buckets[BucketIndex(100)] != 5 {
		t.Fatalf("HistogramDelta = %+v, %v; want the 5 samples of 100 only", d.Count, ok)
	}
	if q := Quantile(d.Buckets, 0.5); q < 90 || q > 110 {
		t.Errorf("interval p50 = %v, want about 100", q)
	}
	// A bucket that went down: a region created again, no delta.
	shrunk := &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 20}
	if _, ok := HistogramDelta(prev, shrunk); ok {
		t.Error("a histogram whose bucket went down gave a delta")
	}
	// No previous: everything is new.
	if d, ok := HistogramDelta(nil, cur); !ok || d.Count != 15 {
		t.Errorf("HistogramDelta(nil, cur) = %d, %v", d.Count, ok)
	}
}

func TestFormatUnits(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{FormatBytes(512), "512 B"},
		{FormatBytes(1500), "1.50 kB"},
		{FormatBytes(12_345_678), "12.3 MB"},
		{FormatRate(56, false), "56.0/s"},
		{FormatRate(12345, false), "12.3k/s"},
		{FormatRate(2.5e6, true), "2.50 MB/s"},
		{FormatMillis(0.25), "250µs"},
		{FormatMillis(12.34), "12.3ms"},
		{FormatMillis(250), "250ms"},
		{FormatMillis(1500), "1.50s"},
		{FormatMillis(math.NaN()), "-"},
		{Sparkline([]float64{0, 1, 2, 4, 8}, 10), "▁▁▂▄█"},
		{Sparkline([]float64{0, 1, 2, 4, 8}, 2), "▄█"},
		{Sparkline([]float64{0, 0}, 5), "▁▁"},
		{Sparkline(nil, 5), ""},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestNDJSON: one object per line; the first has no rates, later ones a
// counter's rate and a histogram's rate and interval quantiles (of the
// interval's samples only); a counter that went down is a reset.
func TestNDJSON(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old := make([]uint64, shm.HistogramBuckets)
	old[BucketIndex(1)] = 1000
	now := append([]uint64(nil), old...)
	now[BucketIndex(50)] += 100
	prev := &shm.Snapshot{Path: "/r", Stats: []shm.Stat{
		{Name: "rq_total", Kind: shm.KindCounter, Counter: 100},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 100},
		{Name: "rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: old, Count: 1000, Sum: 1000}},
		{Name: "active", Kind: shm.KindGauge, Gauge: 4},
	}}
	cur := &shm.Snapshot{Path: "/r", Owners: []shm.Owner{{Slot: 0, State: shm.OwnerLive, PID: 9, Epoch: 2}}, Stats: []shm.Stat{
		{Name: "rq_total", Kind: shm.KindCounter, Counter: 300},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 1},
		{Name: "rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: now, Count: 1100, Sum: 6000}},
		{Name: "active", Kind: shm.KindGauge, Gauge: 5},
	}}
	var n NDJSON
	var b bytes.Buffer
	if err := n.WriteLine(&b, prev, t0); err != nil {
		t.Fatal(err)
	}
	if err := n.WriteLine(&b, cur, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", b.String())
	}
	type stat struct {
		Name      string
		Counter   *uint64
		Value     *int64
		Rate      *float64
		Reset     bool
		Histogram *struct {
			Count    uint64
			Rate     *float64
			Interval *struct {
				Count     uint64
				Quantiles map[string]float64
			}
		}
	}
	type line struct {
		Time     time.Time `json:"time"`
		Interval float64   `json:"interval_seconds"`
		Owners   []struct{ PID int }
		Stats    []stat
	}
	var first, second line
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if first.Interval != 0 {
		t.Errorf("first line interval %v, want 0", first.Interval)
	}
	for _, st := range first.Stats {
		if st.Rate != nil || (st.Histogram != nil && st.Histogram.Interval != nil) {
			t.Errorf("first line has a rate: %s", lines[0])
		}
	}
	if second.Interval != 2 || len(second.Owners) != 1 || second.Owners[0].PID != 9 {
		t.Errorf("second line interval %v owners %+v", second.Interval, second.Owners)
	}
	by := map[string]stat{}
	for _, st := range second.Stats {
		by[st.Name] = st
	}
	if st := by["rq_total"]; st.Rate == nil || *st.Rate != 100 || *st.Counter != 300 {
		t.Errorf("rq_total: %s", lines[1])
	}
	if st := by["shrank"]; !st.Reset || st.Rate != nil {
		t.Errorf("a counter that went down is not a reset: %s", lines[1])
	}
	if st := by["active"]; st.Value == nil || *st.Value != 5 || st.Rate != nil {
		t.Errorf("gauge: %s", lines[1])
	}
	h := by["rq_time"].Histogram
	if h == nil || h.Rate == nil || *h.Rate != 50 || h.Interval == nil || h.Interval.Count != 100 {
		t.Fatalf("histogram rate and interval: %s", lines[1])
	}
	for q, v := range h.Interval.Quantiles {
		if v < 45 || v > 55 {
			t.Errorf("interval quantile %s = %v, want about 50 (the interval's samples, not since start)", q, v)
		}
	}
}

// TestGenerationStates: the newest live generation's state comes from
// server.state; older live ones drain; a folding owner says so.
func TestGenerationStates(t *testing.T) {
	owners := []shm.Owner{{Epoch: 3, State: shm.OwnerLive}, {Epoch: 2, State: shm.OwnerLive}, {Epoch: 1, State: shm.OwnerFolding}}
	for _, tc := range []struct {
		stats map[string]shm.Stat
		want  string
	}{
		{map[string]shm.Stat{"server.state": {Kind: shm.KindGauge, Gauge: 0}}, "serving draining folding"},
		{map[string]shm.Stat{"server.state": {Kind: shm.KindGauge, Gauge: 2}}, "starting draining folding"},
		{map[string]shm.Stat{}, "live live folding"},
	} {
		if got := strings.Join(generationStates(owners, tc.stats), " "); got != tc.want {
			t.Errorf("generationStates = %q, want %q", got, tc.want)
		}
	}
}
