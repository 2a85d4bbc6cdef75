package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// liveRegion opens a real region file in a temporary directory as a
// generation would, with a store of one worker, and closes both at the
// end of the test.
func liveRegion(tb testing.TB) (*stats.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "top.stats")
	r, err := shm.Open(shm.Options{Path: path, Epoch: 7, Lanes: 2})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := stats.New(stats.Options{Region: r, Workers: 1})
	if err != nil {
		r.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.Close()
		r.Close()
	})
	return s, path
}

// TestTopRendersALiveRegion runs `hotproxy top` in process on a region a
// store is writing to, with a fixed screen of 100x30 and two frames. The
// second frame must have every section, a row per listener and cluster of
// the region (not of any other name), a request rate, the latency
// quantiles of the interval, the generation with its epoch, and fit the
// screen; frames are plain text ending in a form feed when stdout is not a
// terminal.
func TestTopRendersALiveRegion(t *testing.T) {
	s, path := liveRegion(t)
	web := s.Counter("listener.web.downstream_rq_total").Lane(1)
	s.Counter("listener.api.downstream_rq_total")
	s.Gauge("listener.web.downstream_cx_active", stats.GaugeSum).Lane(1).Set(3)
	rqTime := s.Histogram("listener.web.downstream_rq_time").Lane(1)
	s.Counter("cluster.backend.upstream_rq_total").Lane(1).Add(5)
	s.Gauge("cluster.backend.membership_total", stats.GaugeNewest).Lane(0).Set(2)
	s.Gauge("cluster.backend.membership_healthy", stats.GaugeNewest).Lane(0).Set(1)
	s.Counter("server.unrelated_total")

	// Before the first frame: samples of 1ms that the interval must not
	// show. Between the frames: requests of 40ms.
	for range 1000 {
		rqTime.Record(1)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// A writer that adds load between the frames; top re-reads the region
	// every 200ms, and the writer runs until the test ends.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				web.Add(10)
				rqTime.Record(40)
				s.Flush()
			}
		}
	}()
	var stdout, stderr bytes.Buffer
	code := run([]string{"top", "--path", path, "--frames", "2", "--interval", "200ms", "--size", "100x30", "--sort", "rate"}, &stdout, &stderr)
	close(stop)
	<-done
	if code != 0 {
		t.Fatalf("hotproxy top: exit %d; stderr: %s", code, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, "\x1b") {
		t.Errorf("escape codes written to a non-terminal:\n%q", out)
	}
	frames := strings.Split(out, "\f\n")
	if len(frames) != 3 || frames[2] != "" {
		t.Fatalf("want 2 frames each ending in a form feed line, got %d parts:\n%s", len(frames), out)
	}
	for i, f := range frames[:2] {
		lines := strings.Split(strings.TrimSuffix(f, "\n"), "\n")
		if len(lines) > 30 {
			t.Errorf("frame %d has %d lines for a 30-row screen", i, len(lines))
		}
		for _, l := range lines {
			if n := utf8.RuneCountInString(l); n > 100 {
				t.Errorf("frame %d line of %d columns for a 100-column screen: %q", i, n, l)
			}
		}
	}
	frame := frames[1]
	t.Logf("second frame:\n%s", frame)

	// The structure: each section's title, then its header.
	structure := []string{
		// The path is last, cut at 100 columns.
		`^hotproxy top  \d\d:\d\d:\d\d  interval \d+ms  sort req/s  /`,
		`^GENERATIONS$`,
		`^SLOT +EPOCH +PID +STATE +AGE +HEARTBEAT$`,
		`^0 +7 +\d+ +live +\d+s +\S+ ago$`,
		`^LISTENERS$`,
		`^NAME +REQ/S +5XX/S +CONN +RX/S +TX/S +P50 +P90 +P99  REQ/S TREND$`,
		// Sorted by rate: web (busy) before api (idle).
		`^web +\d+(\.\d)?k?/s +- +3 +- +- +(3\d|4\d)\.\dms +(3\d|4\d)\.\dms +(3\d|4\d)\.\dms  [▁▂▃▄▅▆▇█]+$`,
		`^api +0\.0/s +- +0 +- +- +- +- +-`,
		`^CLUSTERS$`,
		`^NAME +REQ/S +FAIL/S +CONN +HEALTHY +P50 +P90 +P99$`,
		`^backend +\S+/s +- +0 +1/2 +- +- +-$`,
	}
	lines := strings.Split(frame, "\n")
	at := 0
	for _, want := range structure {
		re := regexp.MustCompile(want)
		for at < len(lines) && !re.MatchString(lines[at]) {
			at++
		}
		if at == len(lines) {
			t.Fatalf("second frame lacks a line matching %s (in this order):\n%s", want, frame)
		}
		at++
	}
	if strings.Contains(frame, "unrelated") {
		t.Errorf("a stat of no listener or cluster has a row:\n%s", frame)
	}
	// The first frame has no interval yet: no rates.
	if !regexp.MustCompile(`(?m)^web +- +- +3 +- +- +- +- +-`).MatchString(frames[0]) {
		t.Errorf("first frame: want no rates and no quantiles before an interval:\n%s", frames[0])
	}
}

// TestTopFilterAndErrors: --filter keeps the matching names only; bad
// flags and a missing region exit with a message naming them.
func TestTopFilterAndErrors(t *testing.T) {
	s, path := liveRegion(t)
	s.Counter("listener.web.downstream_rq_total")
	s.Counter("listener.api.downstream_rq_total")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"top", "--path", path, "--frames", "1", "--size", "80x24", "--filter", "^api$"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !regexp.MustCompile(`(?m)^api `).MatchString(stdout.String()) || regexp.MustCompile(`(?m)^web `).MatchString(stdout.String()) {
		t.Errorf("--filter ^api$ frame:\n%s", stdout.String())
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--path", filepath.Join(t.TempDir(), "none")}, 1, "no such file"},
		{[]string{"--path", path, "--size", "10"}, 2, `--size "10"`},
		{[]string{"--path", path, "--sort", "speed"}, 2, `--sort "speed"`},
		{[]string{"--path", path, "--interval", "0s"}, 2, "--interval"},
		{[]string{"--path", path, "--filter", "a("}, 2, `--filter "a("`},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := run(append([]string{"top"}, tc.args...), &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("top %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

// TestStatsWatchArgs: a bare --watch gets the default interval, and
// "--watch 2s" still means 2s.
func TestStatsWatchArgs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--watch", "--watch=1s"},
		{"--watch --filter x", "--watch=1s --filter x"},
		{"--watch 2s --filter x", "--watch=2s --filter x"},
		{"--filter x --watch", "--filter x --watch=1s"},
		{"-watch 500ms", "-watch=500ms"},
		{"--watch=3s", "--watch=3s"},
	} {
		if got := strings.Join(watchArgs(strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("watchArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestTopShowsTheWatchdog: the watchdog's counts, and the loops whose
// heartbeat is stale now, in a line under the generations.
func TestTopShowsTheWatchdog(t *testing.T) {
	s, path := liveRegion(t)
	s.Counter("watchdog.miss").Lane(0).Add(2)
	s.Counter("watchdog.mega_miss").Lane(0).Add(1)
	s.Gauge("watchdog.main.heartbeat_age_ms", stats.GaugeNewest).Lane(0).Set(5000)
	s.Gauge("watchdog.worker.0.heartbeat_age_ms", stats.GaugeNewest).Lane(0).Set(10)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"top", "--path", path, "--frames", "1", "--size", "120x30"}, &stdout, &stderr); code != 0 {
		t.Fatalf("hotproxy top: exit %d; stderr: %s", code, stderr.String())
	}
	if want := "watchdog: 2 misses, 1 mega misses; stalled now: main 5s"; !strings.Contains(stdout.String(), want) {
		t.Fatalf("top does not say %q:\n%s", want, stdout.String())
	}
}

// TestTopSortTakesTheHeadersWord: the header says "sort req/s", so
// --sort req/s is accepted (it used to be refused), as rate is.
func TestTopSortTakesTheHeadersWord(t *testing.T) {
	_, path := liveRegion(t)
	for _, sortBy := range []string{"req/s", "rate"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"top", "--path", path, "--frames", "1", "--size", "100x30", "--sort", sortBy}, &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), "  sort req/s  ") {
			t.Errorf("top --sort %s: exit %d, stdout %q, stderr %q", sortBy, code, stdout.String(), stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"top", "--path", path, "--sort", "speed"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "req/s") {
		t.Errorf("top --sort speed: exit %d, stderr %q: want a usage error naming the orders", code, stderr.String())
	}
}
