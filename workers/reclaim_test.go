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

// A wave of parks gives the goroutine stacks it freed back once it is
// over: not while connections keep parking in large numbers, not for a
// few, and within reclaimMinInterval of the last reclaim only after it.
func TestReclaimerAfterAWaveOfParks(t *testing.T) {
	calls := 0
	rc := reclaimer{freeOS: func() { calls++ }}
	now := time.Unix(1000, 0)
	wave := int64(reclaimMinPeak / idleWaitStack) // connections whose stacks matter
	steps := []struct {
		asked int64
		want  bool
		why   string
	}{
		{wave / 4, false, "a few parks"},
		{0, false, "too few to matter"},
		{wave / 2, false, "a wave begins"},
		{wave / 2, false, "the wave goes on (enough now, but still coming)"},
		{wave / 64, true, "the wave is over"},
		{0, false, "once is enough"},
		{2 * wave, false, "a second wave"},
		{0, false, "over, within reclaimMinInterval of the first"},
	}
	for i, s := range steps {
		now = now.Add(250 * time.Millisecond)
		if got := rc.parkSwept(s.asked, now); got != s.want {
			t.Fatalf("step %d (%s): reclaimed %v, want %v", i, s.why, got, s.want)
		}
	}
	now = now.Add(reclaimMinInterval)
	if !rc.parkSwept(0, now) || calls != 2 {
		t.Fatalf("the second wave, reclaimMinInterval later: %d reclaims, want 2", calls)
	}
}
