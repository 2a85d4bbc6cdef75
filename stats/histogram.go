package stats

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

const (
	groupShift = 4
	groupSize  = 1 << groupShift
	numGroups  = (NumBuckets + groupSize - 1) / groupSize
)

// histBuf is one buffer of a lane's pair. Bucket groups are allocated on
// first use so that an idle histogram costs little.
type histBuf struct {
	groups [numGroups]atomic.Pointer[[groupSize]uint64]
	sum    atomic.Uint64 // float64 bits
	_      [cacheLine]byte
}

func (b *histBuf) group(g int) *[groupSize]uint64 {
	n := new([groupSize]uint64)
	if b.groups[g].CompareAndSwap(nil, n) {
		return n
	}
	return b.groups[g].Load()
}

// drain moves the buffer's counts into delta (swapping them to zero, so an
// add that raced with the flip is kept for the next flush, never lost) and
// returns the sum.
func (b *histBuf) drain(delta *[NumBuckets]uint64) float64 {
	for g := range b.groups {
		grp := b.groups[g].Load()
		if grp == nil {
			continue
		}
		for i := range grp {
			if atomic.LoadUint64(&grp[i]) != 0 {
				delta[g<<groupShift+i] += atomic.SwapUint64(&grp[i], 0)
			}
		}
	}
	return math.Float64frombits(b.sum.Swap(0))
}

// HistogramLane is a histogram handle bound to one lane: an active/idle
// buffer pair that the main goroutine flips each flush interval.
type HistogramLane struct {
	_      [cacheLine]byte
	active atomic.Uint32
	_      [cacheLine - 4]byte
	bufs   [2]histBuf
}

// Record records a value (NaN and negative values are ignored).
func (h *HistogramLane) Record(v float64) {
	idx := BucketIndex(v)
	if idx < 0 {
		return
	}
	b := &h.bufs[h.active.Load()&1]
	g := b.groups[idx>>groupShift].Load()
	if g == nil {
		g = b.group(idx >> groupShift)
	}
	atomic.AddUint64(&g[idx&(groupSize-1)], 1)
	for {
		old := b.sum.Load()
		if b.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// RecordDuration records d in seconds.
func (h *HistogramLane) RecordDuration(d time.Duration) { h.Record(d.Seconds()) }

// Histogram is a histogram with one buffer pair per lane.
type Histogram struct {
	name   string
	lanes  []*HistogramLane
	region *shm.Region // nil: in process memory only
	id     shm.RecordID

	// mu guards total, this generation's merged histogram, written by
	// flush and read by snapshots.
	mu    sync.Mutex
	total shm.HistogramValue
}

// Name returns the stat name.
func (h *Histogram) Name() string { return h.name }

// Lane returns the handle for lane i (0 = main, 1..Workers = workers).
func (h *Histogram) Lane(i int) *HistogramLane { return h.lanes[i] }

// flush flips every lane's pair, drains the now idle buffers and adds the
// interval to this generation's total and to the region. Main goroutine
// only (under Store.flushMu).
func (h *Histogram) flush() error {
	var delta [NumBuckets]uint64
	var sum float64
	for _, l := range h.lanes {
		old := l.active.Load() & 1
		l.active.Store(old ^ 1)
		sum += l.bufs[old].drain(&delta)
	}
	var count uint64
	for _, c := range delta {
		count += c
	}
	if count == 0 && sum == 0 {
		return nil
	}
	h.mu.Lock()
	for i, c := range delta {
		h.total.Buckets[i] += c
	}
	h.total.Sum += sum
	h.total.Count += count
	h.mu.Unlock()
	if h.region != nil {
		return h.region.AddHistogram(h.id, delta[:], sum, count)
	}
	return nil
}

// Value returns this generation's merged histogram (as of the last flush).
func (h *Histogram) Value() shm.HistogramValue {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.total
	v.Buckets = append([]uint64(nil), h.total.Buckets...)
	return v
}
