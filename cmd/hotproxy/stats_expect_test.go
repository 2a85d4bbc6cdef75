package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/stats"
)

// TestStatsExpect runs `hotproxy stats --expect` in process on a live
// region, as the image's HEALTHCHECK does: exit 0 and no output when the
// stat has the value, 1 naming what it read when it has another or is
// missing, 2 for a malformed expectation or one combined with printing.
func TestStatsExpect(t *testing.T) {
	s, path := liveRegion(t)
	live := s.Gauge("server.live", stats.GaugeNewest).Lane(0)
	expect := func(want string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run([]string{"stats", "--path", path, "--expect", want}, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	live.Set(1)
	if code, out, errOut := expect("server.live=1"); code != 0 || out != "" || errOut != "" {
		t.Errorf("server.live is 1, --expect server.live=1: exit %d, stdout %q, stderr %q; want 0 and no output", code, out, errOut)
	}
	live.Set(0)
	if code, _, errOut := expect("server.live=1"); code != 1 || !strings.Contains(errOut, "server.live is 0") {
		t.Errorf("server.live is 0, --expect server.live=1: exit %d, stderr %q; want 1 saying it is 0", code, errOut)
	}
	if code, _, errOut := expect("server.nonexistent=1"); code != 1 || !strings.Contains(errOut, "no stat server.nonexistent") {
		t.Errorf("--expect on a missing stat: exit %d, stderr %q; want 1 naming it", code, errOut)
	}
	// A name is matched whole, never as a pattern or a prefix.
	if code, _, _ := expect("server.liv=0"); code != 1 {
		t.Errorf("--expect server.liv=0 (a prefix of server.live): exit %d, want 1", code)
	}
	for _, bad := range [][]string{
		{"--expect", "server.live"},
		{"--expect", "=1"},
		{"--expect", "server.live=1", "--format", "json"},
		{"--expect", "server.live=1", "--filter", "x"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"stats", "--path", path}, bad...), &stdout, &stderr); code != exitUsage {
			t.Errorf("stats %v: exit %d, want %d: %s", bad, code, exitUsage, stderr.String())
		}
	}
}
