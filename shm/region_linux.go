package shm

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/edsrzf/mmap-go"
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
	f, err := os.OpenFile(o.Path, os.O_RDWR|os.O_CREATE, o.Mode)
	if err != nil {
		return nil, fmt.Errorf("shm: open region: %w (check the stats path and its permissions; if another user's hotproxy owns it, use another base-id)", err)
	}
	r := &Region{path: o.Path, f: f, log: o.Logger.Named("shm"), index: map[uint64][]uint32{}}
	if err := guardFault(func() error { return r.open(o, want) }); err != nil {
		if r.unmap != nil {
			r.unmap()
		}
		f.Close() // also drops any OFD lock taken
		if isFault(err) {
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
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("shm: region %s: not a regular file (%s)", r.path, adviceForeign)
	}
	// Root too refuses a file of another uid: its owner could truncate or
	// rewrite it under a root process at any time.
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("shm: region %s: owned by uid %d, this process runs as uid %d (run as that user, or %s)", r.path, st.Uid, euid, adviceForeign)
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

func (r *Region) mapFile(size int64) error {
	m, err := mmap.MapRegion(r.f, int(size), mmap.RDWR, 0, 0)
	if err != nil {
		return fmt.Errorf("shm: region %s: mmap: %w", r.path, err)
	}
	r.mem = m
	r.unmap = m.Unmap
	return nil
}

// create initialises an empty file: size first (sparse), then the header
// with the magic first and the ready word last.
func (r *Region) create(o Options, g geometry) error {
	if err := r.f.Truncate(int64(g.totalSize)); err != nil {
		return fmt.Errorf("shm: region %s: reserve %d bytes: %w", r.path, g.totalSize, err)
	}
	if err := r.f.Chmod(o.Mode); err != nil {
		return fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	if err := r.mapFile(int64(g.totalSize)); err != nil {
		return err
	}
	r.g = g
	r.st(hMagic, Magic)
	atomic.StoreUint64(r.word(hVersion), uint64(LayoutMajor)|uint64(LayoutMinor)<<32)
	for _, f := range [][2]uint64{
		{hLayoutHash, LayoutHash}, {hTotalSize, g.totalSize},
		{hMaxOwners, g.maxOwners}, {hMaxLanes, g.maxLanes}, {hMaxRecords, g.maxRecords},
		{hStringBytes, g.stringBytes}, {hValueBytes, g.valueBytes},
		{hOwnersOff, g.ownersOff}, {hRecordsOff, g.recordsOff}, {hStringsOff, g.stringsOff},
		{hValuesOff, g.valuesOff}, {hLanesOff, g.lanesOff}, {hLaneStride, g.laneStride},
		{hCreated, uint64(time.Now().UnixNano())},
	} {
		r.st(f[0], f[1])
	}
	r.st(hReady, 1)
	r.log.Debug("created region", "path", r.path, "size", g.totalSize)
	return nil
}

func (r *Region) attach(size int64) error {
	if size < HeaderSize {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path,
			formatErr("file is %d bytes, shorter than the %d-byte header (truncated)", size, HeaderSize), adviceForeign)
	}
	if err := r.mapFile(size); err != nil {
		return err
	}
	g, err := parseHeader(r.mem)
	if errors.Is(err, errNotReady) {
		return err
	}
	if err != nil {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path, err, adviceForeign)
	}
	if uint64(size) != g.totalSize {
		return fmt.Errorf("shm: region %s: %w (%s)", r.path,
			formatErr("file is %d bytes, its header says %d", size, g.totalSize), adviceForeign)
	}
	r.g = g
	return nil
}

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
			errs = append(errs, err)
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
