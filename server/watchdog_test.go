package server

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// TestWatchdogCountsEachStallOnce: a stall counts one miss when its
// heartbeat passes miss_timeout and one mega miss when it passes
// mega_miss_timeout, however often the watchdog looks; a loop that beats
// again ends the stall, and the next one counts anew. kill_timeout aborts.
func TestWatchdogCountsEachStallOnce(t *testing.T) {
	store, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Watchdog{MissTimeout: config.Duration(50 * time.Millisecond), MegaMissTimeout: config.Duration(time.Second),
		KillTimeout: config.Duration(5 * time.Second)}
	w := newWatchdog(cfg, store, 1, hclog.NewNullLogger())
	var aborted string
	w.abort = func(why string) { aborted = why }
	s := &Server{log: hclog.NewNullLogger()}
	main := w.loops[0]
	value := func(name string) uint64 { return store.Counter(name).Value() }
	for _, age := range []time.Duration{10 * time.Millisecond, 60 * time.Millisecond, 70 * time.Millisecond, 2 * time.Second, 3 * time.Second} {
		w.judge(s, main, age)
	}
	if m, mm := value("watchdog.main.miss"), value("watchdog.main.mega_miss"); m != 1 || mm != 1 {
		t.Fatalf("one stall: %d misses, %d mega misses, want 1 and 1", m, mm)
	}
	w.judge(s, main, time.Millisecond) // beats again
	w.judge(s, main, 100*time.Millisecond)
	if m, mm := value("watchdog.miss"), value("watchdog.mega_miss"); m != 2 || mm != 1 {
		t.Fatalf("two stalls: %d misses, %d mega misses in all, want 2 and 1", m, mm)
	}
	if aborted != "" {
		t.Fatalf("aborted below kill_timeout: %s", aborted)
	}
	w.judge(s, w.loops[1], 6*time.Second)
	if !strings.Contains(aborted, "loop worker.0 has not beaten for 6s") || value("watchdog.worker.0.mega_miss") != 1 {
		t.Fatalf("past kill_timeout: aborted %q, worker mega misses %d", aborted, value("watchdog.worker.0.mega_miss"))
	}
}
