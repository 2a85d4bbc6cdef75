package shm

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// repairLocked finishes interrupted folds and folds dead owners. The caller
// holds the OFD allocation lock.
func (r *Region) repairLocked() error {
	for s := uint64(0); s < r.g.maxOwners; s++ {
		if r.claimedSlot && s == r.slot {
			continue // our own: our OFD lock does not conflict with us
		}
		state := OwnerState(r.ld(r.g.owner(s) + oState))
		if state == OwnerFree {
			continue
		}
		held, err := ofdLocked(r.f, ownerLockBase+int64(s))
		if err != nil {
			return fmt.Errorf("shm: region %s: owner lock %d: %w", r.path, s, err)
		}
		if held {
			continue
		}
		r.log.Info("folding the stats of a generation that died", "path", r.path, "slot", s,
			"pid", r.ld(r.g.owner(s)+oPID), "epoch", r.ld(r.g.owner(s)+oEpoch))
		r.foldLocked(s)
	}
	if seq := r.word(hSeq); atomic.LoadUint64(seq)&1 != 0 {
		atomic.AddUint64(seq, 1) // an allocation died half-way; its record was never published
	}
	return nil
}

// claimLocked takes a free owner slot: its OFD lock first (held for the
// life of the Region, so that "lock free" proves death), then its fields,
// the state last.
func (r *Region) claimLocked(o Options) error {
	for s := uint64(0); s < r.g.maxOwners; s++ {
		ob := r.g.owner(s)
		if OwnerState(r.ld(ob+oState)) != OwnerFree {
			continue
		}
		if err := ofdLock(r.f, ownerLockBase+int64(s), false); err != nil {
			continue
		}
		r.slot, r.epoch, r.start = s, o.Epoch, uint64(time.Now().UnixNano())
		// A slot freed by a generation of a layout before 1.2 may have
		// left its bit set in records: this owner declares nothing yet.
		for rec := uint64(0); rec < uint64(len(r.known)); rec++ {
			r.setDeclaredLocked(RecordID(rec), false)
		}
		r.publishOwnerLocked()
		r.claimedSlot = true
		return nil
	}
	return fmt.Errorf("shm: region %s: %w: all %d are held by live generations", r.path, ErrNoOwnerSlot, r.g.maxOwners)
}

// publishOwnerLocked writes our owner entry, the state last. The caller
// holds the OFD allocation lock and our owner lock.
func (r *Region) publishOwnerLocked() {
	ob := r.g.owner(r.slot)
	r.st(ob+oPID, uint64(os.Getpid()))
	r.st(ob+oEpoch, r.epoch)
	r.st(ob+oStart, r.start)
	r.st(ob+oHeartbeat, uint64(time.Now().UnixNano()))
	r.st(ob+oLanes, r.lanes)
	r.st(ob+oFoldCursor, 0)
	r.st(ob+oFoldJournal, 0)
	r.st(ob+oFoldNew, 0)
	r.st(ob+oDeclares, 1)
	r.st(ob+oState, uint64(OwnerLive))
}

// foldLocked retires owner slot s: its counter lanes are added to the
// retired totals, all its lanes are zeroed (gauges are dropped) and the slot
// is freed. The sequence number is odd throughout. Each record's fold is
// journaled in the owner entry so that a fold interrupted by the folder's
// own death is finished exactly once by the next one (redo log). The caller
// holds the OFD allocation lock.
func (r *Region) foldLocked(s uint64) {
	g := r.g
	ob := g.owner(s)
	seq := r.word(hSeq)
	if atomic.LoadUint64(seq)&1 == 0 {
		atomic.AddUint64(seq, 1)
	}
	r.st(ob+oState, uint64(OwnerFolding))
	lanes := r.ld(ob + oLanes)
	if lanes > g.maxLanes {
		lanes = g.maxLanes
	}
	n := r.ld(hNRecords)
	if n > g.maxRecords {
		n = g.maxRecords
	}
	zero := func(rec uint64) {
		for l := uint64(0); l < lanes; l++ {
			if p := r.word(g.lane(s, l, rec)); atomic.LoadUint64(p) != 0 {
				atomic.StoreUint64(p, 0)
			}
		}
	}
	// retired is the offset of a counter's retired word; ok is false for
	// a record that is not a valid counter (a corrupt record is never
	// written through).
	strUsed, valUsed := min(r.ld(hStringsUsed), g.stringBytes), min(r.ld(hValuesUsed), g.valueBytes)
	retired := func(rec uint64) (off uint64, ok bool) {
		v, err := parseRecord(r.mem, g, rec, strUsed, valUsed)
		if err != nil || v.kind != KindCounter {
			return 0, false
		}
		return g.valuesOff + v.valueOff, true
	}
	if j := r.ld(ob + oFoldJournal); j != 0 && j <= n {
		if off, ok := retired(j - 1); ok {
			r.st(off, r.ld(ob+oFoldNew))
		}
		zero(j - 1)
		r.st(ob+oFoldJournal, 0)
		r.st(ob+oFoldCursor, j)
	}
	for rec := r.ld(ob + oFoldCursor); rec < n; rec++ {
		if off, ok := retired(rec); ok {
			var sum uint64
			for l := uint64(0); l < lanes; l++ {
				sum += r.ld(g.lane(s, l, rec))
			}
			if sum != 0 {
				newTotal := r.ld(off) + sum
				r.st(ob+oFoldNew, newTotal)
				r.st(ob+oFoldJournal, rec+1) // commit point
				r.st(off, newTotal)
			}
		}
		zero(rec)
		// It declares nothing any more (idempotent, so no journal).
		if p := r.word(g.record(rec) + rDeclared); atomic.LoadUint64(p)&(1<<s) != 0 {
			atomic.AndUint64(p, ^uint64(1<<s))
		}
		r.st(ob+oFoldJournal, 0)
		r.st(ob+oFoldCursor, rec+1)
	}
	for _, f := range []uint64{oPID, oEpoch, oStart, oHeartbeat, oLanes, oFoldCursor, oFoldJournal, oFoldNew, oDeclares} {
		r.st(ob+f, 0)
	}
	r.st(ob+oState, uint64(OwnerFree))
	atomic.AddUint64(seq, 1)
}

// Reap folds the owners that died (their owner lock is free). Open and Alloc
// do it too; the main goroutine may call it periodically.
func (r *Region) Reap() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	return r.guardedLocked(true, func() error {
		if err := ofdLock(r.f, allocLockOffset, true); err != nil {
			return fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
		}
		defer ofdUnlock(r.f, allocLockOffset)
		return r.repairLocked()
	})
}

// ownerDead reports whether owner slot s's generation is gone (its owner
// lock is free), for Snapshot. Our own slot is alive: our lock does not
// conflict with us, so the kernel cannot be asked about it.
func (r *Region) ownerDead(s uint64) bool {
	if r.claimedSlot && s == r.slot {
		return false
	}
	held, err := ofdLocked(r.f, ownerLockBase+int64(s))
	return err == nil && !held
}
