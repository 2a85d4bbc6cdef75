package shm

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Snapshot reads the region like a Reader does (without locking or
// writing), retrying while it changes.
func (r *Region) Snapshot() (*Snapshot, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, os.ErrClosed
	}
	var s *Snapshot
	err := guardFault(func() (err error) { s, err = readRetry(r.mem, r.g, r.ownerDead); return err })
	if isFault(err) && !isFull(explainFault(err, r.f, len(r.mem))) {
		r.mu.Lock()
		r.healLocked()
		r.mu.Unlock()
		err = guardFault(func() (err error) { s, err = readRetry(r.mem, r.g, r.ownerDead); return err })
	}
	if err != nil {
		return nil, fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	s.Path = r.path
	return s, nil
}

// Bounded retries of a read that meets a changing region.
const (
	readAttempts = 2000
	readSpins    = 20
)

func readRetry(mem []byte, g geometry, dead ownerDeadFunc) (*Snapshot, error) {
	var err error
	for i := 0; i < readAttempts; i++ {
		var s *Snapshot
		s, err = decodeBody(mem, g, dead)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, ErrBusy) {
			return nil, err
		}
		if i < readSpins {
			continue
		}
		time.Sleep(500 * time.Microsecond)
	}
	return nil, fmt.Errorf("%w after %d attempts: %v (a hotproxy process may have died while allocating; the next one to start repairs it)", ErrBusy, readAttempts, err)
}
