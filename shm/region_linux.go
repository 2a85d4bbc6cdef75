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

// adviceForeign is appended to errors about a file that is not a usable
// region.
const adviceForeign = "use another base-id or stats path, or delete the file if no hotproxy is running"

// Open creates the region file, or attaches to an existing one, and claims
// an owner slot for this generation. Under the allocation lock it first
// repairs an interrupted fold and folds the owners that died. A file that is
// truncated, of another layout major version, not a region at all, or owned
// by another user is refused with an error naming the path; it is never
// modified.
func Open(opts Options) (*Region, error) {
	o := opts.withDefaults()
	want, err := computeGeometry(uint64(o.MaxOwners), uint64(o.MaxLanes), uint64(o.MaxRecords),
		uint64(o.StringBytes), uint64(o.ValueBytes))
	if err != nil {
		return nil, fmt.Errorf("shm: region %s: options: %w", o.Path, err)
	}
	f, err := os.OpenFile(o.Path, os.O_RDWR|os.O_CREATE, o.Mode)
	if err != nil {
		return nil, fmt.Errorf("shm: open region: %w (check the stats path and its permissions; if another user's hotproxy owns it, use another base-id)", err)
	}
	r := &Region{path: o.Path, f: f, log: o.Logger.Named("shm"), index: map[uint64][]uint32{}}
	if err := r.open(o, want); err != nil {
		if r.unmap != nil {
			r.unmap()
		}
		f.Close() // also drops any OFD lock taken
		return nil, err
	}
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
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("shm: region %s: not a regular file (%s)", r.path, adviceForeign)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("shm: region %s: owned by uid %d, this process runs as uid %d (run as that user, or %s)", r.path, st.Uid, euid, adviceForeign)
	}
	if st.Size == 0 {
		if err := r.create(o, want); err != nil {
			return err
		}
	} else if err := r.attach(st.Size); err != nil {
		if !errors.Is(err, errNotReady) {
			return err
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
	if err := r.repairLocked(); err != nil {
		return err
	}
	return r.claimLocked(o)
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
		now := uint64(time.Now().UnixNano())
		r.st(ob+oPID, uint64(os.Getpid()))
		r.st(ob+oEpoch, o.Epoch)
		r.st(ob+oStart, now)
		r.st(ob+oHeartbeat, now)
		r.st(ob+oLanes, r.lanes)
		r.st(ob+oFoldCursor, 0)
		r.st(ob+oFoldJournal, 0)
		r.st(ob+oState, uint64(OwnerLive))
		r.slot = s
		r.claimedSlot = true
		return nil
	}
	return fmt.Errorf("shm: region %s: %w: all %d are held by live generations", r.path, ErrNoOwnerSlot, r.g.maxOwners)
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
	retired := func(rec uint64) uint64 { return g.valuesOff + r.ld(g.record(rec)+rValueOff) }
	if j := r.ld(ob + oFoldJournal); j != 0 && j <= n {
		r.st(retired(j-1), r.ld(ob+oFoldNew))
		zero(j - 1)
		r.st(ob+oFoldJournal, 0)
		r.st(ob+oFoldCursor, j)
	}
	for rec := r.ld(ob + oFoldCursor); rec < n; rec++ {
		if Kind(r.mem[g.record(rec)+rKind]) == KindCounter {
			var sum uint64
			for l := uint64(0); l < lanes; l++ {
				sum += r.ld(g.lane(s, l, rec))
			}
			if sum != 0 {
				newTotal := r.ld(retired(rec)) + sum
				r.st(ob+oFoldNew, newTotal)
				r.st(ob+oFoldJournal, rec+1) // commit point
				r.st(retired(rec), newTotal)
			}
		}
		zero(rec)
		r.st(ob+oFoldJournal, 0)
		r.st(ob+oFoldCursor, rec+1)
	}
	for _, f := range []uint64{oPID, oEpoch, oStart, oHeartbeat, oLanes, oFoldCursor, oFoldJournal, oFoldNew} {
		r.st(ob+f, 0)
	}
	r.st(ob+oState, uint64(OwnerFree))
	atomic.AddUint64(seq, 1)
}

// Alloc returns the record of name, creating it if needed. Creating takes
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
	r.refreshIndexLocked()
	if id, ok, err := r.lookupLocked(name, kind, mode); ok {
		return id, err
	}
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		return 0, fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
	}
	defer ofdUnlock(r.f, allocLockOffset)
	if err := r.repairLocked(); err != nil {
		return 0, err
	}
	r.refreshIndexLocked()
	if id, ok, err := r.lookupLocked(name, kind, mode); ok {
		return id, err
	}
	id, err := r.allocLocked(name, kind, mode)
	if err == nil {
		r.refreshIndexLocked()
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
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		return fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
	}
	defer ofdUnlock(r.f, allocLockOffset)
	return r.repairLocked()
}

// Close retires this generation cleanly: its counter lanes fold into the
// retired totals, its gauge lanes are dropped, its owner slot is freed, and
// the file is unmapped and closed. Every writer of this owner's lanes must
// have stopped before Close: the lane words are unmapped. Close is
// idempotent.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		errs = append(errs, fmt.Errorf("allocation lock: %w", err))
	} else {
		// The file may have been truncated under us: a fault is an error.
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.unmap()
	r.f.Close()
}
