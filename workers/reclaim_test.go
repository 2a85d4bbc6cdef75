package workers

import (
	"testing"
	"time"
)

// The reclaimer gives memory back once a burst is over, and only then:
// not during it, not under a steady load however high, not for a burst
// too small to matter, and not more often than reclaimMinInterval.
func TestReclaimerWaitsForTheEndOfABurst(t *testing.T) {
	wk := &worker{}
	calls := 0
	rc := reclaimer{freeOS: func() { calls++ }}
	now := time.Unix(1000, 0)
	poll := func(held int64) bool {
		now = now.Add(reclaimPoll)
		wk.front.Bufs.Add(held - wk.front.Bufs.Held())
		return rc.poll([]*worker{wk}, now)
	}
	steps := []struct {
		held int64
		want bool
		why  string
	}{
		{reclaimMinPeak / 2, false, "a small load"},
		{0, false, "after a load too small to matter"},
		{0, false, "still nothing to give back"},
		{4 * reclaimMinPeak, false, "during a burst"},
		{4 * reclaimMinPeak, false, "a steady high load"},
		{4 * reclaimMinPeak / 2, false, "half way down"},
		{reclaimMinPeak / 4, false, "the first poll after the burst"},
		{reclaimMinPeak / 4, true, "the burst stayed over for a whole poll"},
		{reclaimMinPeak / 4, false, "once is enough"},
	}
	for i, s := range steps {
		if got := poll(s.held); got != s.want {
			t.Fatalf("step %d (%s): reclaimed %v, want %v", i, s.why, got, s.want)
		}
	}
	// A second burst right away waits for reclaimMinInterval.
	poll(4 * reclaimMinPeak)
	poll(0)
	if poll(0) {
		t.Fatal("a second reclaim within reclaimMinInterval")
	}
	for range int(reclaimMinInterval/reclaimPoll) + 1 {
		poll(0)
	}
	if calls != 2 {
		t.Fatalf("%d reclaims, want 2 (the second once reclaimMinInterval passed)", calls)
	}
	// A burst seen only between two polls (it came and went) counts.
	wk.front.Bufs.Add(4 * reclaimMinPeak)
	wk.front.Bufs.Add(-4 * reclaimMinPeak)
	now = now.Add(reclaimMinInterval)
	if poll(0) || !poll(0) {
		t.Fatal("a burst between two polls was not reclaimed after a quiet poll")
	}
}
