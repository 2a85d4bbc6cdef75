package workers

import (
	"runtime"
	"runtime/debug"
	"time"
)

// Giving a burst's memory back. A burst of simultaneous requests takes a
// read buffer and a request state for each (downstream/http/h1state.go);
// when it is over they wait in their sync.Pools, and the heap keeps the pages: nothing
// allocates any more, so no GC runs to empty the pools (sync.Pool drops
// its contents over two GCs) or to shrink the goroutine stacks the
// requests grew, and the Go scavenger returns free pages only down to
// about the heap goal the burst itself set, at about 1% of a CPU. Measured
// (4,000 simultaneous first requests, then idle; scripts/bench-peers.sh
// burst): the pools alone left ~25 KiB of RSS per connection six seconds
// later, as much as the 32 KiB buffers did.
//
// So the reclaimer watches what the workers' connections hold and, once a
// burst that held at least reclaimMinPeak has fallen to an eighth of its
// peak and stayed there for a whole poll, runs one GC (the pools' contents
// move to their victim caches, stacks shrink) and debug.FreeOSMemory (a
// second GC frees them, and the free pages go back to the OS at once).
// Both run on the reclaimer's goroutine, never on a request's, at most
// once per reclaimMinInterval; a steady load, however high, never triggers
// them, as what it holds does not fall.
//
// Parks give memory back too: each connection the park sweep parks ends
// its goroutine's wait, and its stack (idleWaitStack) goes back to the
// runtime, which keeps the pages as it keeps the pools'. Once the sweep
// has parked connections whose stacks add up to reclaimMinPeak (2,048
// of them) and a sweep parks no more than an eighth of that wave, it is
// over: the same GC and FreeOSMemory, under the same reclaimMinInterval.
// Measured (4,000 idle connections, scripts/bench-peers.sh memory): 5.9
// KB of RSS per parked connection without it, 2.75 to 3.3 with it
// (parking at every idle transition, which never has that many
// goroutines at once, measured 2.46 beside it; the rest is most likely
// the runtime's goroutines, which it keeps once made, for the next ones).
const (
	reclaimPoll         = 500 * time.Millisecond
	reclaimMinPeak      = 8 << 20 // about 600 requests' state at once
	reclaimMinInterval  = 10 * time.Second
	reclaimFallenToPart = 8
	// idleWaitStack is about what a connection waiting idle in its
	// goroutine holds of stack (TestParkedIdleConnHasNoStack: ~4 KiB),
	// what its park gives back.
	idleWaitStack = 4 << 10
)

// reclaimer is the burst detector's state, owned by its goroutine.
type reclaimer struct {
	peak  int64 // the most held since the last reclaim (per-worker peaks summed)
	quiet bool  // the previous poll already found the burst over
	last  time.Time
	// parked is how many connections the park sweep has parked since
	// the last reclaim (parkSwept).
	parked int64
	// freeOS gives the memory back: debug.FreeOSMemory after a GC; a
	// test may count the calls.
	freeOS func()
}

func freeOSMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// runReclaimer polls until stop is closed.
func (m *Manager) runReclaimer(stop <-chan struct{}) {
	rc := reclaimer{freeOS: freeOSMemory}
	t := time.NewTicker(reclaimPoll)
	defer t.Stop()
	var parkTick <-chan time.Time
	if m.parkIdleAfter > 0 {
		pt := time.NewTicker(m.parkIdleAfter)
		defer pt.Stop()
		parkTick = pt.C
	}
	for {
		select {
		case <-stop:
			return
		case now := <-parkTick:
			rc.parkSwept(int64(m.sweepIdleToPark()), now)
		case now := <-t.C:
			rc.poll(m.workers, now)
			for _, wk := range m.workers {
				wk.pool.retire()
			}
		}
	}
}

// poll looks once at what the workers hold, and reclaims when a burst is
// over. It reports whether it did.
func (rc *reclaimer) poll(workers []*worker, now time.Time) bool {
	var held, peak int64
	for _, wk := range workers {
		h, p := wk.front.Bufs.Sample()
		held += h
		peak += p
	}
	rc.peak = max(rc.peak, peak)
	over := rc.peak >= reclaimMinPeak && held <= rc.peak/reclaimFallenToPart
	wasQuiet := rc.quiet
	rc.quiet = over
	if !over || !wasQuiet || now.Sub(rc.last) < reclaimMinInterval {
		return false
	}
	rc.freeOS()
	rc.peak, rc.quiet, rc.last = held, false, now
	return true
}

// parkSwept counts the connections one park sweep parked (asked), and
// reclaims when a wave of parks large enough to matter is over. It
// reports whether it did.
func (rc *reclaimer) parkSwept(asked int64, now time.Time) bool {
	rc.parked += asked
	if rc.parked*idleWaitStack < reclaimMinPeak || asked > rc.parked/reclaimFallenToPart || now.Sub(rc.last) < reclaimMinInterval {
		return false
	}
	rc.freeOS()
	rc.parked, rc.last = 0, now
	return true
}
