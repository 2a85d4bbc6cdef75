package shm

// Surviving a truncated region file.
//
// Whoever can write the region file (our own uid, or root: Open refuses a
// file that group or others may write) can truncate it. The kernel then
// unmaps the lost pages from every process, and the next access to them is
// a SIGBUS, which kills a Go program. tmpfs files opened by path cannot be
// sealed against shrinking (F_SEAL_* is for memfds), and fallocate does not
// stop a truncate, so the region cannot be made unshrinkable. Instead:
//
//   - every access from this package runs under guardFault, so a fault is
//     an error, and the stats package's lane handles do the same on the hot
//     path (see stats.CounterLane);
//   - a watcher (inotify IN_MODIFY, which a truncate raises) restores the
//     size at once, without taking a lock; Check, called at each stats
//     flush, does the same in case the watcher could not be set up;
//   - under the allocation lock, the generation then writes back what the
//     truncation destroyed and it knows: the header, the records it has
//     indexed (values start again from zero), its own owner entry. It
//     stamps the header (hHealStamp) so that the other live generations
//     write back theirs too.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// errNeedsHeal: the region is not as this generation left it.
var errNeedsHeal = errors.New("region needs restoring")

// Check restores the region if its file was truncated (or its header
// overwritten): the size first, then the header, the records this
// generation knows and its owner entry. The values in the lost part of the
// file start again from zero. When nothing is wrong it costs an fstat and a
// few loads. Call it from the main goroutine's flush loop (stats.Store.Flush
// does); the watcher started by Open calls it as soon as the file changes.
func (r *Region) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	if err := r.healLocked(); err != nil {
		return err
	}
	// Keep the copies of the records current, so that a truncation can
	// write back the records other generations allocated too.
	return r.guardedLocked(true, r.refreshIndexLocked)
}

// restoreSize sets the file's size back to the region's if it changed, and
// counts it. It takes no lock, so that the watcher does it within
// microseconds of the truncation: growing a file to the size every
// generation of this region maps is idempotent and cannot hurt anyone.
func (r *Region) restoreSize() (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
		return false, err
	}
	if uint64(st.Size) == r.g.totalSize {
		return false, nil
	}
	if err := unix.Ftruncate(int(r.f.Fd()), int64(r.g.totalSize)); err != nil {
		return false, fmt.Errorf("restoring its size from %d to %d bytes: %w", st.Size, r.g.totalSize, err)
	}
	if uint64(st.Size) < r.g.totalSize {
		r.truncations.Add(1)
	}
	r.sizeRestored.Store(true)
	return true, nil
}

// healLocked makes the region whole again if it is not as we left it. The
// caller holds mu.
func (r *Region) healLocked() error {
	if r.closed || r.mem == nil {
		return nil
	}
	if _, err := r.restoreSize(); err != nil {
		return fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	// The size restored (by us, maybe by the watcher a moment ago) means
	// any part of the file may be zeros now, records included: rebuild.
	if !r.sizeRestored.Swap(false) && guardFault(r.intactLocked) == nil {
		return nil
	}
	if err := ofdLock(r.f, allocLockOffset, true); err != nil {
		return fmt.Errorf("shm: region %s: allocation lock: %w", r.path, err)
	}
	defer ofdUnlock(r.f, allocLockOffset)
	// A truncation may come again while we rebuild: bounded retries.
	for attempt := 0; ; attempt++ {
		if _, err := r.restoreSize(); err != nil {
			return fmt.Errorf("shm: region %s: %w", r.path, err)
		}
		err := guardFault(r.rebuildLocked)
		if err == nil {
			return nil
		}
		if !isFault(err) || attempt == 3 {
			return fmt.Errorf("shm: region %s: restoring it after a truncation: %w", r.path, err)
		}
	}
}

// intactLocked reports (nil) whether the header, the heal stamp and our
// owner entry are as we left them.
func (r *Region) intactLocked() error {
	if g, err := parseHeader(r.mem); err != nil || g != r.g {
		return errNeedsHeal
	}
	if r.ld(hHealStamp) != r.healStamp || !r.ownerIntactLocked() {
		return errNeedsHeal
	}
	return nil
}

func (r *Region) ownerIntactLocked() bool {
	if !r.claimedSlot {
		return true
	}
	ob := r.g.owner(r.slot)
	return OwnerState(r.ld(ob+oState)) == OwnerLive && r.ld(ob+oPID) == uint64(os.Getpid()) &&
		r.ld(ob+oEpoch) == r.epoch && r.ld(ob+oStart) == r.start && r.ld(ob+oLanes) == r.lanes
}

// rebuildLocked writes back the header, the records we know and our owner
// entry, where the file lost them. The caller holds mu and the allocation
// lock; a truncation under it faults (guardFault).
func (r *Region) rebuildLocked() error {
	g := r.g
	changed := false
	if hg, err := parseHeader(r.mem); err == nil && hg != g {
		return errors.New("its header now describes another region layout; this generation's stats there are lost until it exits (restart it to attach again)")
	} else if err != nil {
		r.writeHeaderLocked()
		changed = true
	}
	seq := r.word(hSeq)
	if atomic.LoadUint64(seq)&1 == 0 {
		atomic.AddUint64(seq, 1) // odd: readers wait
	}
	defer atomic.AddUint64(seq, 1)

	if !r.ownerIntactLocked() {
		r.publishOwnerLocked()
	}
	rewritten := 0
	for i := range r.known {
		k := &r.known[i]
		n, strUsed, valUsed, err := usedSizes(r.mem, g)
		if err != nil {
			return err
		}
		if uint64(i) < n {
			v, err := parseRecord(r.mem, g, uint64(i), strUsed, valUsed)
			if err == nil {
				if v.name != k.name || v.kind != k.kind || v.mode != k.mode {
					// Nothing to do about it but say so, once: take the
					// current stamp as seen so the next check passes.
					r.healStamp = r.ld(hHealStamp)
					return fmt.Errorf("record %d is now %s %q, this generation has %s %q there (another generation allocated it after the truncation); values may be attributed to the wrong stat until this generation exits",
						i, v.kind, v.name, k.kind, k.name)
				}
				k.valueOff = v.valueOff
				continue
			}
		}
		if err := r.writeRecordLocked(uint64(i), k, n, strUsed, valUsed); err != nil {
			return err
		}
		rewritten++
		changed = true
	}
	stamp := r.ld(hHealStamp)
	if changed {
		stamp = max(uint64(time.Now().UnixNano()), stamp+1)
		r.st(hHealStamp, stamp)
		r.log.Debug("restored the stats region", "path", r.path, "records_written_back", rewritten)
	}
	r.healStamp = stamp
	return nil
}

// writeHeaderLocked writes a fresh header for our geometry: the file's
// header was lost. Counts start at zero; the ready word is stored last.
func (r *Region) writeHeaderLocked() {
	g := r.g
	r.st(hReady, 0)
	r.st(hMagic, Magic)
	atomic.StoreUint64(r.word(hVersion), uint64(LayoutMajor)|uint64(LayoutMinor)<<32)
	for _, f := range [][2]uint64{
		{hLayoutHash, LayoutHash}, {hTotalSize, g.totalSize},
		{hMaxOwners, g.maxOwners}, {hMaxLanes, g.maxLanes}, {hMaxRecords, g.maxRecords},
		{hStringBytes, g.stringBytes}, {hValueBytes, g.valueBytes},
		{hOwnersOff, g.ownersOff}, {hRecordsOff, g.recordsOff}, {hStringsOff, g.stringsOff},
		{hValuesOff, g.valuesOff}, {hLanesOff, g.lanesOff}, {hLaneStride, g.laneStride},
		{hSeq, 1}, {hNRecords, 0}, {hStringsUsed, 0}, {hValuesUsed, 0},
		{hCreated, uint64(time.Now().UnixNano())},
	} {
		r.st(f[0], f[1])
	}
	r.st(hReady, 1)
}

// writeRecordLocked writes record i back from our copy, with its name and
// zeroed values appended to the string table and value heap; n is the
// record count, which grows if i is the next record.
func (r *Region) writeRecordLocked(i uint64, k *recordView, n, strUsed, valUsed uint64) error {
	g := r.g
	words := k.kind.valueWords()
	if uint64(len(k.name)) > g.stringBytes-strUsed || words*8 > g.valueBytes-valUsed {
		return fmt.Errorf("no room left to write back record %d (%q)", i, k.name)
	}
	copy(r.mem[g.stringsOff+strUsed:], k.name)
	for w := uint64(0); w < words; w++ {
		r.st(g.valuesOff+valUsed+w*8, 0)
	}
	ro := g.record(i)
	atomic.StoreUint32((*uint32)(unsafePointer(r.mem, ro+rState)), recordFree)
	r.mem[ro+rKind] = byte(k.kind)
	r.mem[ro+rMode] = byte(k.mode)
	r.st(ro+rHash, hashName(k.name))
	r.st(ro+rNameOff, strUsed)
	r.st(ro+rNameLen, uint64(len(k.name)))
	r.st(ro+rValueOff, valUsed)
	r.st(ro+rValueWords, words)
	atomic.StoreUint32((*uint32)(unsafePointer(r.mem, ro+rState)), recordUsed)
	k.valueOff = valUsed
	r.st(hStringsUsed, strUsed+uint64(len(k.name)))
	r.st(hValuesUsed, valUsed+words*8)
	if i >= n {
		r.st(hNRecords, i+1)
	}
	return nil
}

// startWatch starts the goroutine that restores the file as soon as it
// changes. Without it (inotify unavailable) the flush's Check does it, up
// to a flush interval later.
func (r *Region) startWatch() {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		r.log.Warn("cannot watch the stats region for truncation (inotify); it is checked at each stats flush only", "path", r.path, "error", err)
		return
	}
	// Watch our open file, not whatever the path names now.
	self := "/proc/self/fd/" + strconv.Itoa(int(r.f.Fd()))
	if _, err := unix.InotifyAddWatch(fd, self, unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		r.log.Warn("cannot watch the stats region for truncation (inotify); it is checked at each stats flush only", "path", r.path, "error", err)
		return
	}
	events := os.NewFile(uintptr(fd), "inotify "+r.path)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			if _, err := events.Read(buf); err != nil {
				return // closed by stopWatch
			}
			r.restoreSize() // first, before any lock
			r.mu.Lock()
			if err := r.healLocked(); err != nil {
				r.log.Error("stats region changed under this generation and could not be restored", "path", r.path, "error", err)
			}
			r.mu.Unlock()
		}
	}()
	var once sync.Once
	r.stopWatch = func() {
		once.Do(func() {
			events.Close()
			<-done
		})
	}
}
