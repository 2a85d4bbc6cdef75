package shm

import (
	"os"
	"sync/atomic"
)

// declareLocked records that this generation declares record id: the
// stat belongs to its config, so readers do not take it for one that only
// an older config had (Stat.Retired). The caller holds mu.
func (r *Region) declareLocked(id RecordID) {
	if r.declared == nil {
		r.declared = map[RecordID]bool{}
	}
	r.declared[id] = true
	r.setDeclaredLocked(id, true)
}

// setDeclaredLocked sets or clears this owner's bit of record id; it
// writes only when the bit differs.
func (r *Region) setDeclaredLocked(id RecordID, on bool) {
	if uint64(id) >= r.g.maxRecords {
		return
	}
	p := r.word(r.g.record(uint64(id)) + rDeclared)
	bit := uint64(1) << r.slot
	switch has := atomic.LoadUint64(p)&bit != 0; {
	case on && !has:
		atomic.OrUint64(p, bit)
	case !on && has:
		atomic.AndUint64(p, ^bit)
	}
}

// Undeclare says that this generation no longer declares the stat of that
// name (its listener or cluster was removed): once no live generation
// declares it, readers see it as retired. Its values stay. A name that
// has no record is ignored.
func (r *Region) Undeclare(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	return r.guardedLocked(true, func() error {
		if err := r.refreshIndexLocked(); err != nil {
			return err
		}
		for _, i := range r.index[hashName(name)] {
			if r.known[i].name == name {
				delete(r.declared, RecordID(i))
				r.setDeclaredLocked(RecordID(i), false)
			}
		}
		return nil
	})
}
