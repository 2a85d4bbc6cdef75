package stats

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
//	<name>:  <value>  <rate>  <interval quantiles>
//	...
//	<blank line>
//
// in aligned columns. The value is a counter's or gauge's number (a byte
// counter's in kB, MB, ...: FormatBytes), a histogram's "count=N sum=S
// p50=... p90=... p99=..." since the region was created.
//
// The first block has no rates and no "(rates over ...)" in its header.
// Later, a counter or histogram line has its per-second increase over the
// interval ("+56.0/s", "+1.20 MB/s": FormatRate), or "reset" when there is
// no rate to give: the count went down or the stat changed kind (the
// region was deleted and created again), or the interval is not positive.
// A histogram that recorded samples in the interval is followed by the
// quantiles of those samples alone ("last 1s: p50=... p90=... p99=..."; in
// ms, µs or s for a *_time histogram, whose unit is the millisecond). A
// stat created during the interval counts from 0. Gauges have no rate.
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
	var rows [][4]string // name:, value, rate, interval quantiles
	for _, st := range wt.Expose.selected(snap) {
		row := [4]string{st.Name + ":", watchValue(st)}
		if row[1] == "" {
			continue // a kind this version does not know
		}
		if wt.prev != nil && st.Kind != shm.KindGauge {
			// A stat created during the interval counted from 0 (p is
			// the zero Stat); one that changed kind is of a region
			// created again.
			p, seen := before[st.Name]
			sameKind := !seen || p.Kind == st.Kind
			if r, ok := counterRate(countOf(p), countOf(st), dt); ok && sameKind {
				row[2] = "+" + FormatRate(r, isBytes(st.Name))
			} else {
				row[2] = "reset"
			}
			if st.Kind == shm.KindHistogram && row[2] != "reset" {
				var prevH *shm.HistogramValue
				if seen {
					prevH = p.Histogram
				}
				if d, ok := HistogramDelta(prevH, st.Histogram); ok && d.Count > 0 {
					row[3] = "last " + dt.Round(time.Millisecond).String() + ": " + quantileText(st.Name, d.Buckets)
				}
			}
		}
		rows = append(rows, row)
	}
	writeAligned(&b, rows)
	b.WriteByte('\n')
	if _, err := w.Write(b.Bytes()); err != nil {
		return err
	}
	wt.prev, wt.prevAt = snap, at
	return nil
}

// watchValue is the value column of a stat in a Watch block; "" for a kind
// this version does not know.
func watchValue(st shm.Stat) string {
	switch st.Kind {
	case shm.KindCounter:
		if isBytes(st.Name) {
			return FormatBytes(float64(st.Counter))
		}
		return strconv.FormatUint(st.Counter, 10)
	case shm.KindGauge:
		return strconv.FormatInt(st.Gauge, 10)
	case shm.KindHistogram:
		h := st.Histogram
		return fmt.Sprintf("count=%d sum=%s %s", h.Count, FormatSum(h.Sum), quantileText(st.Name, h.Buckets))
	}
	return ""
}

// quantileText is "p50=... p90=... p99=..." of buckets: in ms, µs or s for
// a *_time histogram (whose unit is the millisecond), plain numbers for
// others.
func quantileText(name string, buckets []uint64) string {
	var b strings.Builder
	for i, q := range textQuantiles {
		if i > 0 {
			b.WriteByte(' ')
		}
		v := Quantile(buckets, q)
		b.WriteString("p" + strconv.FormatFloat(q*100, 'f', -1, 64) + "=")
		if strings.HasSuffix(name, "_time") {
			b.WriteString(FormatMillis(v))
		} else {
			b.WriteString(strconv.FormatFloat(v, 'g', 4, 64))
		}
	}
	return b.String()
}

// writeAligned writes rows as lines of left-aligned names, right-aligned
// values and left-aligned rates and quantiles, two spaces apart, with no
// trailing spaces.
func writeAligned(b *bytes.Buffer, rows [][4]string) {
	var width [4]int
	for _, r := range rows {
		for i, c := range r {
			if i == 1 && strings.HasPrefix(c, "count=") {
				// A histogram's long value would push every number
				// far right; it overflows its column instead.
				continue
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range rows {
		line := fmt.Sprintf("%-*s  %*s", width[0], r[0], width[1], r[1])
		if strings.HasPrefix(r[1], "count=") {
			line = fmt.Sprintf("%-*s  %s", width[0], r[0], r[1])
		}
		if width[2] > 0 {
			line += "  " + r[2] + strings.Repeat(" ", width[2]-utf8.RuneCountInString(r[2]))
		}
		if r[3] != "" {
			line += "  " + r[3]
		}
		b.WriteString(strings.TrimRight(line, " "))
		b.WriteByte('\n')
	}
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
