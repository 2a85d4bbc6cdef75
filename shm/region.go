package shm

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"
)

// Sentinel errors.
var (
	// ErrFull: the region has no room left for a new record (records,
	// string table or value heap). The caller keeps the stat in process
	// memory.
	ErrFull = errors.New("shm: region full")
	// ErrKindMismatch: a record of that name exists with another kind or
	// gauge mode.
	ErrKindMismatch = errors.New("shm: stat exists with another kind or gauge mode")
	// ErrNoOwnerSlot: every owner slot is taken by a live generation.
	ErrNoOwnerSlot = errors.New("shm: no free owner slot")
)

// RecordID identifies a record of a region.
type RecordID uint32

// Region is a region opened for writing by one generation (one owner
// slot). Its methods are safe for concurrent use; the lane words it hands
// out are written with atomic adds and stores only.
type Region struct {
	path  string
	f     *os.File
	mem   []byte
	unmap func() error
	g     geometry
	slot  uint64
	lanes uint64
	// claimedSlot is set once slot is ours (under the OFD lock).
	claimedSlot bool
	// epoch and start are what our owner entry says, kept to write it again
	// if the file is truncated under us.
	epoch, start uint64
	log          hclog.Logger

	// truncations counts the times this Region found its file shorter than
	// the region and restored its size (see Check).
	truncations atomic.Uint64
	// sizeRestored is set when restoreSize grew the file back, until the
	// contents are rebuilt (healLocked).
	sizeRestored atomic.Bool
	// stopWatch stops the goroutine that restores the file at once when it
	// shrinks (nil if there is none).
	stopWatch func()

	// mu guards index, known, healStamp and closed, and serialises
	// allocation within this process (an OFD lock does not exclude
	// goroutines that share the open file).
	mu    sync.Mutex
	index map[uint64][]uint32 // name hash -> record indexes below len(known)
	// known holds validated copies of records 0..len(known)-1, in record
	// order. Lookups use them, never the region's bytes a second time, and
	// after a truncation they are what is written back.
	known []recordView
	// healStamp is the region's heal stamp (header word hHealStamp) as of
	// our last check; a change means another generation restored the file
	// and we must check our own records and owner entry.
	healStamp uint64
	closed    bool
	// declared is the set of records this generation declares (Alloc),
	// whose bits Heartbeat sets again if the region lost them.
	declared map[RecordID]bool
}

// Path returns the region file's path.
func (r *Region) Path() string { return r.path }

// Slot returns this owner's slot in the owner table.
func (r *Region) Slot() int { return int(r.slot) }

// Lanes returns the number of lanes this owner writes.
func (r *Region) Lanes() int { return int(r.lanes) }

func (r *Region) word(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }

func (r *Region) ld(off uint64) uint64 { return atomic.LoadUint64(r.word(off)) }

func (r *Region) st(off, v uint64) { atomic.StoreUint64(r.word(off), v) }

// adviceForeign is appended to errors about a file that is not a usable
// region.
const adviceForeign = "use another base-id or stats path, or delete the file if no hotproxy is running"

// corrupt wraps an error about the region's bytes with the path and what
// to do.
func (r *Region) corrupt(err error) error {
	return fmt.Errorf("shm: region %s: %w (%s)", r.path, err, adviceForeign)
}

// Heartbeat stores the current time in this owner's heartbeat word, and
// sets this owner's bit again in the records it declares where the bit was
// lost (a truncated region written back). Call it from the main
// goroutine's flush loop.
func (r *Region) Heartbeat() { r.HeartbeatAt(time.Now()) }

// HeartbeatAt is Heartbeat with the time given: the last moment the owner
// knows itself alive (a watchdog's least recent loop), which a supervisor
// reading the owner table takes as the generation's liveness.
func (r *Region) HeartbeatAt(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.guardedLocked(true, func() error {
			r.st(r.g.owner(r.slot)+oHeartbeat, uint64(t.UnixNano()))
			for id := range r.declared {
				r.setDeclaredLocked(id, true)
			}
			return nil
		})
	}
}

// guardedLocked runs fn, which touches the mapping, so that a truncation of
// the file under it is an error, not a crash: on a memory fault the file is
// restored (healLocked) and, if retry, fn runs once more. The caller holds
// mu; fn must release anything it takes with defer.
func (r *Region) guardedLocked(retry bool, fn func() error) error {
	err := guardFault(fn)
	if !isFault(err) {
		return err
	}
	// A full filesystem is not healed by restoring anything, and the
	// same page would fault again.
	if isFull(explainFault(err, r.f, len(r.mem))) {
		return fmt.Errorf("shm: region %s: %w", r.path, err)
	}
	if herr := r.healLocked(); herr != nil {
		return fmt.Errorf("shm: region %s: %w; restoring it: %w", r.path, err, herr)
	}
	if !retry {
		return fmt.Errorf("shm: region %s: %w (restored; this update was lost)", r.path, err)
	}
	if err = guardFault(fn); isFault(err) {
		if isFull(explainFault(err, r.f, len(r.mem))) {
			return fmt.Errorf("shm: region %s: %w", r.path, err)
		}
		return fmt.Errorf("shm: region %s: %w (again after restoring it)", r.path, err)
	}
	return err
}

// Truncations returns how many times this Region found its file truncated
// and restored its size (see Check).
func (r *Region) Truncations() uint64 { return r.truncations.Load() }

func unsafePointer(mem []byte, off uint64) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
