package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
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

func TestWriteWatchBlock(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	prev := &watchPoint{at: t0, snap: &shm.Snapshot{Path: "/r", Stats: []shm.Stat{
		{Name: "listener.web.downstream_rq_total", Kind: shm.KindCounter, Counter: 1000},
		{Name: "listener.web.downstream_cx_active", Kind: shm.KindGauge, Gauge: 3},
		{Name: "listener.web.downstream_rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 10, Sum: 10}},
		{Name: "gone", Kind: shm.KindCounter, Counter: 5},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 50},
	}}}
	cur := &watchPoint{at: t0.Add(2 * time.Second), snap: &shm.Snapshot{Path: "/r", Stats: []shm.Stat{
		{Name: "listener.web.downstream_rq_total", Kind: shm.KindCounter, Counter: 1112},
		{Name: "listener.web.downstream_cx_active", Kind: shm.KindGauge, Gauge: 5},
		{Name: "listener.web.downstream_rq_time", Kind: shm.KindHistogram, Histogram: &shm.HistogramValue{Buckets: make([]uint64, shm.HistogramBuckets), Count: 30, Sum: 40}},
		{Name: "new", Kind: shm.KindCounter, Counter: 4},
		{Name: "shrank", Kind: shm.KindCounter, Counter: 2},
		{Name: "zero", Kind: shm.KindCounter},
	}}}

	var first bytes.Buffer
	if err := writeWatchBlock(&first, prev, nil, statsPrint{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(first.String(), "/s)") || strings.Contains(first.String(), "(reset)") {
		t.Errorf("the first block has rates:\n%s", first.String())
	}
	if !strings.HasPrefix(first.String(), "--- 2026-01-02T03:04:05.000Z /r ---\n") {
		t.Errorf("first block header:\n%s", first.String())
	}

	var b bytes.Buffer
	if err := writeWatchBlock(&b, cur, prev, statsPrint{expose: stats.ExposeOptions{UsedOnly: true}}); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"--- 2026-01-02T03:04:07.000Z /r (rates over the last 2s) ---\n",
		"listener.web.downstream_rq_total: 1112 (+56.0/s)\n",
		"listener.web.downstream_cx_active: 5\n",
		"new: 4 (+2.0/s)\n",
		"shrank: 2 (reset)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("block lacks %q:\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^listener\.web\.downstream_rq_time: count=30 sum=40 .* \(\+10\.0/s\)$`).MatchString(got) {
		t.Errorf("histogram line lacks its count rate:\n%s", got)
	}
	for _, absent := range []string{"gone", "zero"} {
		if strings.Contains(got, absent) {
			t.Errorf("block shows %q:\n%s", absent, got)
		}
	}
	// Sorted by name, like `hotproxy stats`.
	if i, j := strings.Index(got, "listener.web.downstream_cx_active"), strings.Index(got, "new:"); i > j {
		t.Errorf("not sorted by name:\n%s", got)
	}

	var f bytes.Buffer
	o := statsPrint{expose: stats.ExposeOptions{Filter: regexp.MustCompile(`rq_total`)}, owners: true}
	cur.snap.Owners = []shm.Owner{{Slot: 1, State: shm.OwnerLive, PID: 4242, Epoch: 3, Start: t0, Heartbeat: t0.Add(1500 * time.Millisecond), Lanes: 3}}
	if err := writeWatchBlock(&f, cur, prev, o); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(f.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("filtered block with owners: want header, owner header, owner, blank, stat:\n%s", f.String())
	}
	if fields := strings.Fields(lines[2]); strings.Join(fields, " ") != "1 4242 3 live 2026-01-02T03:04:05.000Z 500ms ago 3" {
		t.Errorf("owner line %q", lines[2])
	}
	if lines[4] != "listener.web.downstream_rq_total: 1112 (+56.0/s)" {
		t.Errorf("filtered stat line %q", lines[4])
	}
}

// TestStatsCLIErrors runs the verb in process on files that are not a
// region: exit statuses and messages.
func TestStatsCLIErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.stats")
	garbage := filepath.Join(dir, "garbage.stats")
	junk := bytes.Repeat([]byte("not a region\n"), 1000)
	if err := os.WriteFile(garbage, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"missing", []string{"--path", missing}, 1, []string{missing + ": no such file (", "--path"}},
		{"garbage", []string{"--path", garbage}, 1, []string{garbage, "not a valid hotproxy stats region"}},
		{"directory", []string{"--path", dir}, 1, []string{dir, "not a regular file"}},
		{"bad regex", []string{"--path", garbage, "--filter", "a("}, 2, []string{`--filter "a("`}},
		{"bad format", []string{"--format", "xml"}, 2, []string{`--format "xml"`}},
		{"watch with json", []string{"--watch", "1s", "--format", "json"}, 2, []string{"--watch"}},
		{"negative base-id", []string{"--base-id", "-1"}, 2, []string{"--base-id"}},
		{"argument", []string{"extra"}, 2, []string{`unexpected argument "extra"`}},
		{"help", []string{"--help"}, 0, []string{"never touches the running proxy", "-base-id", "-path", "-c ", "-filter", "-usedonly", "-format", "-owners", "-watch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"stats"}, tc.args...), &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstderr: %s", code, tc.code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q: %s", w, stderr.String())
				}
			}
		})
	}
	if after, err := os.ReadFile(garbage); err != nil || !bytes.Equal(after, junk) {
		t.Errorf("the garbage file was changed (%v)", err)
	}
}
