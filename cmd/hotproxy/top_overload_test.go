package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/stats"
)

// TestTopShowsOverload: a region with the overload manager's stats gets
// an OVERLOAD section with each monitor's pressure and each action's
// state; one without gets none.
func TestTopShowsOverload(t *testing.T) {
	s, path := liveRegion(t)
	g := func(name string, v int64) { s.Gauge(name, stats.GaugeNewest).Lane(0).Set(v) }
	s.Counter("listener.web.downstream_rq_total").Lane(1).Add(1)
	frame := func() string {
		t.Helper()
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if code := run([]string{"top", "--path", path, "--frames", "1", "--size", "140x40"}, &stdout, &stderr); code != 0 {
			t.Fatalf("hotproxy top: exit %d; stderr: %s", code, stderr.String())
		}
		return stdout.String()
	}
	if out := frame(); strings.Contains(out, "OVERLOAD") {
		t.Fatalf("an OVERLOAD section without the overload manager:\n%s", out)
	}
	g("overload.monitor.heap.pressure_percent", 41)
	g("overload.monitor.connections.pressure_percent", 3)
	g("overload.stop_accepting.active", 1)
	g("overload.stop_accepting.scale_percent", 100)
	g("overload.shrink_timeouts.active", 1)
	g("overload.shrink_timeouts.scale_percent", 40)
	g("overload.reset_connections.active", 0)
	g("overload.reset_connections.scale_percent", 0)
	s.Counter("overload.shed_total").Lane(1).Add(7)
	out := frame()
	for _, want := range []string{"OVERLOAD", "heap 41%", "connections 3%", "stop_accepting ON", "shrink_timeouts 40%", "reset_connections off", "shed/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("top does not show %q:\n%s", want, out)
		}
	}
}
