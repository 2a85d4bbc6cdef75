package shm

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// errBeingRestored: the file is empty or its header wiped, but a live
// generation holds an owner lock on it: it was truncated under that
// generation, which is restoring it. Open waits for that.
var errBeingRestored = errors.New("the region was truncated while a live generation uses it, and is being restored")

// errReplaced: the file opened is no longer the one at the path (it was
// pruned, or replaced, between the open and the allocation lock). Open
// tries again.
var errReplaced = errors.New("the file was removed or replaced while opening it")

// Waiting for a live generation to restore a truncated region (Open).
const (
	restoreWait = 2 * time.Second
	restorePoll = 10 * time.Millisecond
)

// Open creates the region file, or attaches to an existing one, and claims
// an owner slot for this generation. Under the allocation lock it first
// repairs an interrupted fold and folds the owners that died. A file that is
// truncated, of another layout major version, not a region at all,
// corrupt, owned by another user, or writable by group or others is refused
// with an error naming the path; it is never modified. The Region then
// watches its file: if it is truncated, the size is restored at once (the
// values in the lost part start again from zero) and counted (Truncations).
func Open(opts Options) (*Region, error) {
	o := opts.withDefaults()
	want, err := computeGeometry(uint64(o.MaxOwners), uint64(o.MaxLanes), uint64(o.MaxRecords),
		uint64(o.StringBytes), uint64(o.ValueBytes))
	if err != nil {
		return nil, fmt.Errorf("shm: region %s: options: %w", o.Path, err)
	}
	if o.Mode&^os.ModePerm != 0 || o.Mode&0o022 != 0 {
		return nil, fmt.Errorf("shm: region %s: mode %#o: %w", o.Path, o.Mode, errWritableMode)
	}
	deadline := time.Now().Add(restoreWait)
	for {
		r, err := open(o, want)
		if (errors.Is(err, errBeingRestored) || errors.Is(err, errReplaced)) && time.Now().Before(deadline) {
			time.Sleep(restorePoll)
			continue
		}
		return r, err
	}
}

// errWritableMode explains why a region must not be writable by others.
var errWritableMode = errors.New("writable by group or others: whoever can write the region can truncate it or corrupt the stats of every generation (use 0640 so the group may read it, or 0600)")

func open(o Options, want geometry) (*Region, error) {
	f, err := openRegionFile(o.Path, o.Mode)
	if err != nil {
		return nil, err
	}
	r := &Region{path: o.Path, f: f, log: o.Logger.Named("shm"), index: map[uint64][]uint32{}}
	if err := guardFault(func() error { return r.open(o, want) }); err != nil {
		err = explainFault(err, f, len(r.mem)) // before the unmap
		if r.unmap != nil {
			r.unmap()
		}
		f.Close() // also drops any OFD lock taken
		switch {
		case isFull(err):
			err = fmt.Errorf("shm: region %s (creating or attaching to it): %w", r.path, err)
		case isFault(err):
			err = fmt.Errorf("shm: region %s: %w while attaching; %s", r.path, err, adviceForeign)
		}
		return nil, err
	}
	r.startWatch()
	return r, nil
}

func (r *Region) open(o Options, want geometry) error {
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		return fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
	}
	defer ofdUnlock(r.f, allocLockOffset)

	var st unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
		return fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	// `hotproxy stats --prune` removes a region under this lock: one we
	// opened just before is no longer at the path, and using it would
	// count into a file nobody can read. Open again.
	var at unix.Stat_t
	if err := unix.Stat(r.path, &at); err != nil || at.Dev != st.Dev || at.Ino != st.Ino {
		return fmt.Errorf("shm: region %s: %w", r.path, errReplaced)
	}
	// Type, owner and links again, now that the file is locked (they
	// were checked right after the open, before anything touched it).
	if err := checkRegionFile(int(r.f.Fd()), r.path); err != nil {
		return err
	}
	if perm := st.Mode & 0o7777; perm&0o022 != 0 {
		return fmt.Errorf("shm: region %s: mode %#o: %w; chmod 0640 %s if you trust whoever could write it until now, else remove it if no hotproxy is running", r.path, perm, errWritableMode, r.path)
	}
	if st.Size == 0 || (st.Size >= HeaderSize && r.headerWiped()) {
		// An empty file or a zeroed header with a live owner is a region
		// truncated under a running generation, which restores it in a
		// moment: wait, never create over it.
		if held, err := r.ownerLockHeld(); err != nil {
			return err
		} else if held {
			return fmt.Errorf("shm: region %s: %w", r.path, errBeingRestored)
		}
	}
	if st.Size == 0 {
		if err := r.create(o, want); err != nil {
			return err
		}
	} else if err := r.attach(st.Size); err != nil {
		if !errors.Is(err, errNotReady) {
			return err
		}
		if held, err := r.ownerLockHeld(); err != nil {
			return err
		} else if held {
			return fmt.Errorf("shm: region %s: %w", r.path, errBeingRestored)
		}
		// Magic present but never marked ready, and we hold the lock that
		// its creator held while creating it: the creator died. Recreate.
		r.log.Warn("region was left half-created, recreating it", "path", r.path)
		r.unmap()
		r.unmap = nil
		if err := r.f.Truncate(0); err != nil {
			return fmt.Errorf("shm: region %s: %w", r.path, err)
		}
		if err := r.create(o, want); err != nil {
			return err
		}
	}
	if o.Lanes < 1 || uint64(o.Lanes) > r.g.maxLanes {
		return fmt.Errorf("shm: region %s: %d lanes asked, the region has %d per owner (use fewer workers, or delete the file if no hotproxy is running so it is recreated with Options.MaxLanes)", r.path, o.Lanes, r.g.maxLanes)
	}
	r.lanes = uint64(o.Lanes)
	if err := r.validateOwners(); err != nil {
		return err
	}
	if err := r.refreshIndexLocked(); err != nil {
		return err
	}
	if err := r.repairLocked(); err != nil {
		return err
	}
	r.healStamp = r.ld(hHealStamp)
	return r.claimLocked(o)
}

// validateOwners checks every owner entry of an attached region.
func (r *Region) validateOwners() error {
	for s := uint64(0); s < r.g.maxOwners; s++ {
		if _, _, err := parseOwner(r.mem, r.g, s); err != nil {
			return r.corrupt(err)
		}
	}
	return nil
}

// headerWiped reports whether the first header page of the file reads as
// zeros (the file was truncated and extended again). It reads the file,
// not a mapping.
func (r *Region) headerWiped() bool {
	var buf [HeaderSize]byte
	if n, err := r.f.ReadAt(buf[:], 0); n != HeaderSize && err != nil {
		return false
	}
	for _, b := range buf {
		if b != 0 {
			return false
		}
	}
	return true
}

// ownerLockHeld reports whether another open file description holds the
// owner lock of any slot a region can have: a live generation maps the
// file.
func (r *Region) ownerLockHeld() (bool, error) {
	for s := int64(0); s < maxOwnersLimit; s++ {
		held, err := ofdLocked(r.f, ownerLockBase+s)
		if err != nil {
			return false, fmt.Errorf("shm: region %s: owner lock %d: %w", r.path, s, err)
		}
		if held {
			return true, nil
		}
	}
	return false, nil
}

// Close retires this generation cleanly: its counter lanes fold into the
// retired totals, its gauge lanes are dropped, its owner slot is freed, and
// the file is unmapped and closed. Every writer of this owner's lanes must
// have stopped before Close: the lane words are unmapped. Close is
// idempotent.
func (r *Region) Close() error {
	if r.stopWatch != nil {
		r.stopWatch() // before mu: the watcher takes it
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	// Make the file whole first if it was truncated since the last check,
	// so that the fold below does not fault.
	r.healLocked()
	r.closed = true
	var errs []error
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		errs = append(errs, fmt.Errorf("allocation lock: %w", err))
	} else {
		// The file may be truncated again under us: a fault is an error.
		if err := guardFault(func() error { r.foldLocked(r.slot); return nil }); err != nil {
			errs = append(errs, explainFault(err, r.f, len(r.mem)))
		}
		r.claimedSlot = false
		if err := ofdUnlock(r.f, ownerLockBase+int64(r.slot)); err != nil {
			errs = append(errs, err)
		}
		if err := ofdUnlock(r.f, allocLockOffset); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.unmap(), r.f.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shm: close region %s: %w", r.path, err)
	}
	return nil
}

// abandon drops the region like a killed process would: no fold, the OFD
// locks go with the file. For tests.
func (r *Region) abandon() {
	if r.stopWatch != nil {
		r.stopWatch()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.unmap()
	r.f.Close()
}
