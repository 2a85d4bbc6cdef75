package shm

import (
	"fmt"
	"os"
)

// Alloc returns the record of name, creating it if needed, and declares
// it as this generation's (see Undeclare). Creating takes
// the OFD allocation lock (and folds owners found dead); finding an
// existing record does not. It fails with ErrFull when the region has no
// room and ErrKindMismatch when name exists with another kind or mode.
func (r *Region) Alloc(name string, kind Kind, mode GaugeMode) (RecordID, error) {
	if kind != KindCounter && kind != KindGauge && kind != KindHistogram {
		return 0, fmt.Errorf("shm: unknown kind %d", kind)
	}
	if kind != KindGauge {
		mode = GaugeSum
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, os.ErrClosed
	}
	var id RecordID
	err := r.guardedLocked(true, func() (err error) {
		if id, err = r.allocOnceLocked(name, kind, mode); err == nil {
			r.declareLocked(id)
		}
		return err
	})
	return id, err
}

func (r *Region) allocOnceLocked(name string, kind Kind, mode GaugeMode) (RecordID, error) {
	// Without the allocation lock a record being written back by another
	// generation's restore may not check out yet: on an error, look again
	// under the lock below.
	if err := r.refreshIndexLocked(); err == nil {
		if id, ok, err := r.lookupLocked(name, kind, mode); ok {
			return id, err
		}
	}
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		return 0, fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
	}
	defer ofdUnlock(r.f, allocLockOffset)
	if err := r.repairLocked(); err != nil {
		return 0, err
	}
	if err := r.refreshIndexLocked(); err != nil {
		return 0, err
	}
	if id, ok, err := r.lookupLocked(name, kind, mode); ok {
		return id, err
	}
	id, err := r.allocLocked(name, kind, mode)
	if err == nil {
		err = r.refreshIndexLocked()
	}
	return id, err
}
