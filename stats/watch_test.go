package stats

import (
	"bytes"
	"errors"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

func TestCounterRate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur uint64
		dt        time.Duration
		want      float64
		ok        bool
	}{
		{"steady", 1000, 1056, time.Second, 56, true},
		{"short interval", 10, 15, 100 * time.Millisecond, 50, true},
		{"no change", 7, 7, 250 * time.Millisecond, 0, true},
		{"from zero", 0, 3, 2 * time.Second, 1.5, true},
		{"huge values", math.MaxUint64 - 10, math.MaxUint64, time.Second, 10, true},
		{"went down: region created again", 100, 4, time.Second, 0, false},
		{"no interval", 1, 2, 0, 0, false},
		{"clock went back", 1, 2, -time.Second, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := counterRate(tc.prev, tc.cur, tc.dt)
			if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("counterRate(%d, %d, %v) = %v, %v; want %v, %v", tc.prev, tc.cur, tc.dt, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestWatchWriteBlock(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	prev := &shm.Snapshot{Path: "/r", Stats: []shm.Stat{
		{Name: "listener.web.downstream_rq_total", Kind: shm.KindCounter, Counter: 1000},
		{Name: "listener.web.downstream_cx_active", Kind: shm.KindGauge, Gauge: 3},
		{Name: "listener.web.downstream_rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 10, Sum: 10}},
		{Name: "gone", Kind: shm.KindCounter, Counter: 5},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 50},
		{Name: "flipped", Kind: shm.KindCounter, Counter: 1},
	}}
	cur := &shm.Snapshot{Path: "/r", Stats: []shm.Stat{
		{Name: "listener.web.downstream_rq_total", Kind: shm.KindCounter, Counter: 1112},
		{Name: "listener.web.downstream_cx_active", Kind: shm.KindGauge, Gauge: 5},
		{Name: "listener.web.downstream_rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 30, Sum: 40}},
		{Name: "new", Kind: shm.KindCounter, Counter: 4},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 2},
		{Name: "flipped", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 7, Sum: 7}},
		{Name: "zero", Kind: shm.KindCounter},
	}}

	w := Watch{Expose: ExposeOptions{UsedOnly: true}}
	var first bytes.Buffer
	if err := w.WriteBlock(&first, prev, t0); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(first.String(), "/s") || strings.Contains(first.String(), "reset") {
		t.Errorf("the first block has rates:\n%s", first.String())
	}
	if want := "" +
		"--- 2026-01-02T03:04:05.000Z /r ---\n" +
		"flipped:                               1\n" +
		"gone:                                  5\n" +
		"listener.web.downstream_cx_active:     3\n" +
		"listener.web.downstream_rq_time:    count=10 sum=10 p50=0µs p90=0µs p99=0µs\n" +
		"listener.web.downstream_rq_total:   1000\n" +
		"shrank:                               50\n" +
		"\n"; first.String() != want {
		t.Errorf("first block:\n%s\nwant (aligned columns, sorted by name, ending in a blank line)\n%s", first.String(), want)
	}

	var b bytes.Buffer
	if err := w.WriteBlock(&b, cur, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	// Spacing is checked above and in TestWatchAligned; here, the words.
	norm := regexp.MustCompile(` +`).ReplaceAllString(got, " ")
	for _, want := range []string{
		"--- 2026-01-02T03:04:07.000Z /r (rates over the last 2s) ---\n",
		"listener.web.downstream_rq_total: 1112 +56.0/s\n",
		"listener.web.downstream_cx_active: 5\n",
		"new: 4 +2.0/s\n",
		"shrank: 2 reset\n",
	} {
		if !strings.Contains(norm, want) {
			t.Errorf("block lacks %q:\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^listener\.web\.downstream_rq_time: count=30 sum=40 .* \+10\.0/s( last 2s: .*)?$`).MatchString(norm) {
		t.Errorf("histogram line lacks its count rate:\n%s", got)
	}
	if !regexp.MustCompile(`(?m)^flipped: count=7 .* reset$`).MatchString(norm) {
		t.Errorf("a stat that changed kind is not a reset:\n%s", got)
	}
	for _, absent := range []string{"gone", "zero"} {
		if strings.Contains(got, absent) {
			t.Errorf("block shows %q:\n%s", absent, got)
		}
	}
	// Sorted by name, like WriteText.
	if i, j := strings.Index(got, "listener.web.downstream_cx_active"), strings.Index(got, "new:"); i > j {
		t.Errorf("not sorted by name:\n%s", got)
	}

	// Rates are against the last block written: cur again, 1s later.
	var again bytes.Buffer
	if err := w.WriteBlock(&again, cur, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := regexp.MustCompile(` +`).ReplaceAllString(again.String(), " "); !strings.Contains(n, "(rates over the last 1s)") || !strings.Contains(n, "listener.web.downstream_rq_total: 1112 +0.0/s\n") {
		t.Errorf("third block not against the second:\n%s", again.String())
	}

	// A failed write leaves the Watch as it was.
	if err := w.WriteBlock(failWriter{}, prev, t0.Add(4*time.Second)); err == nil {
		t.Fatal("WriteBlock to a failing writer: no error")
	}
	again.Reset()
	if err := w.WriteBlock(&again, cur, t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := regexp.MustCompile(` +`).ReplaceAllString(again.String(), " "); !strings.Contains(n, "(rates over the last 2s)") || !strings.Contains(n, "shrank: 2 +0.0/s\n") {
		t.Errorf("a failed block changed the previous snapshot:\n%s", again.String())
	}

	var f bytes.Buffer
	fw := Watch{Expose: ExposeOptions{Filter: regexp.MustCompile(`rq_total`)}, Owners: true}
	cur.Owners = []shm.Owner{{Slot: 1, State: shm.OwnerLive, PID: 4242, Epoch: 3, Start: t0, Heartbeat: t0.Add(1500 * time.Millisecond), Lanes: 3}}
	if err := fw.WriteBlock(&bytes.Buffer{}, prev, t0); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteBlock(&f, cur, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(f.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("filtered block with owners: want header, owner header, owner, blank, stat:\n%s", f.String())
	}
	if fields := strings.Fields(lines[2]); strings.Join(fields, " ") != "1 4242 3 live 2026-01-02T03:04:05.000Z 500ms ago 3" {
		t.Errorf("owner line %q", lines[2])
	}
	if lines[4] != "listener.web.downstream_rq_total:  1112  +56.0/s" {
		t.Errorf("filtered stat line %q", lines[4])
	}
}

// TestWatchUnitsAndIntervalQuantiles: byte counters are in kB/MB with a
// rate in MB/s, and a *_time histogram shows the quantiles of the
// interval alone in ms, not those since the region was created.
func TestWatchUnitsAndIntervalQuantiles(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// Since start: 1000 samples of 1ms. In the interval: 100 of 50ms.
	old := make([]uint64, shm.HistogramBuckets)
	old[BucketIndex(1)] = 1000
	now := append([]uint64(nil), old...)
	now[BucketIndex(50)] += 100
	prev := &shm.Snapshot{Stats: []shm.Stat{
		{Name: "l.rx_bytes_total", Kind: shm.KindCounter, Counter: 1_000_000},
		{Name: "l.rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: old, Count: 1000, Sum: 1000}},
	}}
	cur := &shm.Snapshot{Stats: []shm.Stat{
		{Name: "l.rx_bytes_total", Kind: shm.KindCounter, Counter: 3_500_000},
		{Name: "l.rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: now, Count: 1100, Sum: 6000}},
	}}
	var w Watch
	if err := w.WriteBlock(io.Discard, prev, t0); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := w.WriteBlock(&b, cur, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if !strings.Contains(got, "l.rx_bytes_total:  3.50 MB  +2.50 MB/s\n") {
		t.Errorf("byte counter not in MB with a MB/s rate:\n%s", got)
	}
	// Since start p50 is about 1ms; the interval's p50 is about 50ms.
	m := regexp.MustCompile(`last 1s: p50=([0-9.]+)ms p90=([0-9.]+)ms p99=([0-9.]+)ms`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("no interval quantiles in ms:\n%s", got)
	}
	for _, q := range m[1:] {
		if v, _ := strconv.ParseFloat(q, 64); v < 45 || v > 55 {
			t.Errorf("interval quantile %sms, want about 50ms (the interval's samples only):\n%s", q, got)
		}
	}
	if !regexp.MustCompile(`count=1100 sum=6000 p50=9\d\dµs`).MatchString(got) {
		t.Errorf("since-start quantiles wrong:\n%s", got)
	}
}

func TestWriteOwners(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	owners := []shm.Owner{
		{Slot: 0, State: shm.OwnerLive, PID: 4242, Epoch: 3, Start: t0, Heartbeat: t0.Add(1500 * time.Millisecond), Lanes: 3},
		{Slot: 12, State: shm.OwnerFolding, PID: 7, Epoch: 2, Start: time.Unix(0, 0), Heartbeat: time.Unix(0, 0), Lanes: 17},
		{Slot: 2, State: shm.OwnerLive, PID: 99999, Epoch: 4, Start: t0, Heartbeat: t0.Add(time.Hour), Lanes: 0},
	}
	now := t0.Add(2 * time.Second)

	var b bytes.Buffer
	if err := WriteOwners(&b, owners, now); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"SLOT  PID    EPOCH  STATE    START                     HEARTBEAT  LANES\n" +
		"0     4242   3      live     2026-01-02T03:04:05.000Z  500ms ago  3\n" +
		"12    7      2      folding  -                         -          17\n" +
		"2     99999  4      live     2026-01-02T03:04:05.000Z  0s ago     0\n" +
		"\n"
	if b.String() != want {
		t.Errorf("WriteOwners:\n%s\nwant\n%s", b.String(), want)
	}

	b.Reset()
	if err := WriteOwners(&b, nil, now); err != nil {
		t.Fatal(err)
	}
	if want := "SLOT  PID  EPOCH  STATE  START  HEARTBEAT  LANES\n(no owners: no generation is attached to this region)\n\n"; b.String() != want {
		t.Errorf("WriteOwners with no owners:\n%q\nwant\n%q", b.String(), want)
	}

	b.Reset()
	if err := WriteOwnerComments(&b, owners[:2], now); err != nil {
		t.Fatal(err)
	}
	want = "" +
		"# hotproxy owner slot=0 pid=4242 epoch=3 state=live start=2026-01-02T03:04:05.000Z heartbeat_age=500ms ago lanes=3\n" +
		"# hotproxy owner slot=12 pid=7 epoch=2 state=folding start=- heartbeat_age=- lanes=17\n"
	if b.String() != want {
		t.Errorf("WriteOwnerComments:\n%s\nwant\n%s", b.String(), want)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("write failed") }

// TestSumsAreReadable: a histogram's sum is written with at most three
// decimals in text and in --watch blocks, never as the float's whole
// expansion (3077.0071629999943).
func TestSumsAreReadable(t *testing.T) {
	for v, want := range map[float64]string{3077.0071629999943: "3077.007", 6.253: "6.253", 2: "2", 0: "0", 0.0004: "0", 12.5: "12.5"} {
		if got := FormatSum(v); got != want {
			t.Errorf("FormatSum(%v) = %q, want %q", v, got, want)
		}
	}
	s := newStore(t, Options{})
	h := s.Histogram("listener.web.downstream_rq_time")
	for _, v := range []float64{1000.0023, 2077.0048629999943} {
		h.Lane(0).Record(v)
	}
	s.Flush()
	snap, _ := s.Snapshot()
	var text, block bytes.Buffer
	WriteText(&text, snap, ExposeOptions{Filter: regexp.MustCompile(`rq_time`)})
	var w Watch
	if err := w.WriteBlock(&block, snap, time.Now()); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"text": text.String(), "watch": block.String()} {
		if !strings.Contains(out, "sum=3077.007 ") || regexp.MustCompile(`sum=\d+\.\d{4,}`).MatchString(out) {
			t.Errorf("%s output has no readable sum=3077.007:\n%s", name, out)
		}
	}
}
