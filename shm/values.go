package shm

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
)

// Lane returns this owner's lane word of a counter or gauge record. Only
// atomic operations may touch it (atomic.AddUint64 / StoreUint64); a gauge
// lane holds an int64 in two's complement. Lane 0 is the main goroutine's by
// convention. The word is valid until Close.
func (r *Region) Lane(id RecordID, lane int) (*uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, os.ErrClosed
	}
	if lane < 0 || uint64(lane) >= r.lanes {
		return nil, fmt.Errorf("shm: lane %d out of range [0,%d)", lane, r.lanes)
	}
	var v recordView
	err := r.guardedLocked(true, func() (err error) { v, err = r.knownLocked(id); return err })
	if err != nil {
		return nil, err
	}
	if v.kind != KindCounter && v.kind != KindGauge {
		return nil, fmt.Errorf("%w: record %d is a %s, which has no lanes", ErrKindMismatch, id, v.kind)
	}
	p := r.word(r.g.lane(r.slot, uint64(lane), uint64(id)))
	// Touch the word now: an atomic add of 0 changes nothing, but makes the
	// kernel give its page of the sparse file a block, so that a full
	// filesystem is this error (explainFault: ENOSPC), here, rather than a
	// memory fault that loses every update on the hot path.
	if err := r.guardedLocked(true, func() error { atomic.AddUint64(p, 0); return nil }); err != nil {
		return nil, err
	}
	return p, nil
}

// AddHistogram adds an interval's bucket counts (len HistogramBuckets or
// less), sum and count into a histogram record. Any generation may add
// concurrently; the adds are atomic.
func (r *Region) AddHistogram(id RecordID, buckets []uint64, sum float64, count uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	if len(buckets) > HistogramBuckets {
		return fmt.Errorf("shm: %d histogram buckets, at most %d", len(buckets), HistogramBuckets)
	}
	// No second try after a fault: the adds done before it would count twice.
	return r.guardedLocked(false, func() error { return r.addHistogramLocked(id, buckets, sum, count) })
}

func (r *Region) addHistogramLocked(id RecordID, buckets []uint64, sum float64, count uint64) error {
	if _, err := r.knownLocked(id); err != nil {
		return err
	}
	// Read the record again rather than trust the copy: the value offset
	// must be valid in the region as it is now (another generation may
	// have written the record back elsewhere after a truncation).
	_, strUsed, valUsed, err := usedSizes(r.mem, r.g)
	if err != nil {
		return r.corrupt(err)
	}
	v, err := parseRecord(r.mem, r.g, uint64(id), strUsed, valUsed)
	if err != nil {
		return r.corrupt(err)
	}
	if v.kind != KindHistogram {
		return fmt.Errorf("%w: record %d is a %s", ErrKindMismatch, id, v.kind)
	}
	base := r.g.valuesOff + v.valueOff
	for i, c := range buckets {
		if c != 0 {
			atomic.AddUint64(r.word(base+uint64(i)*8), c)
		}
	}
	if sum != 0 {
		p := r.word(base + HistogramSumWord*8)
		for {
			old := atomic.LoadUint64(p)
			if atomic.CompareAndSwapUint64(p, old, math.Float64bits(math.Float64frombits(old)+sum)) {
				break
			}
		}
	}
	if count != 0 {
		atomic.AddUint64(r.word(base+HistogramCountWord*8), count)
	}
	return nil
}
