package stats

import (
	"bytes"
	"fmt"
	"io"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

// Watch writes successive snapshots of one region as blocks of text with
// counter rates, for a person watching it live. It remembers the snapshot
// of the last block, so each counter (and histogram sample count) can be
// followed by its increase per second since then. The zero value writes
// every stat and no owner table. A Watch is not safe for concurrent use.
type Watch struct {
	// Expose selects the stats of each block, as for WriteText.
	Expose ExposeOptions
	// Owners writes the owner table (WriteOwners) at the top of each
	// block.
	Owners bool

	prev   *shm.Snapshot // the snapshot of the last block; nil before the first
	prevAt time.Time     // when prev was taken
}

// WriteBlock writes the block of snap, taken at at, with a single Write to
// w:
//
//	--- <at> <region path> (rates over the last <interval>) ---
//	<owner table, if Owners>
//	<each selected stat's line of WriteText>[ (+R/s) | (reset)]
//	<blank line>
//
// The first block has no rates and no "(rates over ...)" in its header.
// Later, a counter or histogram line ends in " (+R/s)", its per-second
// increase over the interval, or in " (reset)" when there is no rate to
// give: the count went down or the stat changed kind (the region was
// deleted and created again), or the interval is not positive. A stat
// created during the interval counts from 0. Gauges have no rate.
//
// On success snap becomes the snapshot the next block's rates are taken
// against; on error the Watch is unchanged.
func (wt *Watch) WriteBlock(w io.Writer, snap *shm.Snapshot, at time.Time) error {
	var b bytes.Buffer
	var dt time.Duration
	if wt.prev != nil {
		dt = at.Sub(wt.prevAt)
		fmt.Fprintf(&b, "--- %s %s (rates over the last %v) ---\n", at.Format(TimeFormat), snap.Path, dt.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "--- %s %s ---\n", at.Format(TimeFormat), snap.Path)
	}
	if wt.Owners {
		if err := WriteOwners(&b, snap.Owners, at); err != nil {
			return err
		}
	}
	var before map[string]shm.Stat
	if wt.prev != nil {
		before = make(map[string]shm.Stat, len(wt.prev.Stats))
		for _, st := range wt.prev.Stats {
			before[st.Name] = st
		}
	}
	var line []byte
	for _, st := range wt.Expose.selected(snap) {
		// WriteText's own line for this stat, so a block reads exactly
		// like the text exposition.
		line = appendText(line[:0], st)
		b.Write(line)
		if wt.prev != nil && st.Kind != shm.KindGauge {
			// A stat created during the interval counted from 0 (p is
			// the zero Stat); one that changed kind is of a region
			// created again.
			p, seen := before[st.Name]
			if r, ok := counterRate(countOf(p), countOf(st), dt); ok && (!seen || p.Kind == st.Kind) {
				fmt.Fprintf(&b, " (+%.1f/s)", r)
			} else {
				b.WriteString(" (reset)")
			}
		}
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	if _, err := w.Write(b.Bytes()); err != nil {
		return err
	}
	wt.prev, wt.prevAt = snap, at
	return nil
}

// countOf is what a rate is taken of: a counter's value, a histogram's
// sample count.
func countOf(st shm.Stat) uint64 {
	switch st.Kind {
	case shm.KindCounter:
		return st.Counter
	case shm.KindHistogram:
		if st.Histogram != nil {
			return st.Histogram.Count
		}
	}
	return 0
}

// counterRate is the per-second increase of a counter that went from prev
// to cur over dt. ok is false when there is no rate to give: dt is not
// positive, or the counter went down, which a counter of one region never
// does (the region was deleted and created again).
func counterRate(prev, cur uint64, dt time.Duration) (perSecond float64, ok bool) {
	if dt <= 0 || cur < prev {
		return 0, false
	}
	return float64(cur-prev) / dt.Seconds(), true
}
