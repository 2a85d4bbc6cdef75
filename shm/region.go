package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
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

// Options configures Open. The zero value is usable: it opens the default
// region of base-id 0 with one lane.
type Options struct {
	// Path of the region file. Default: DefaultPath(BaseID).
	Path string
	// BaseID selects the default path; ignored when Path is set.
	BaseID uint64
	// Mode of a created file. Default DefaultMode (0640).
	Mode os.FileMode
	// Epoch of this generation (restart epoch), recorded in the owner table.
	Epoch uint64
	// Lanes is the number of lanes this owner writes (1 + workers for the
	// stats package). Default 1. At most MaxLanes of the region.
	Lanes int
	// Capacities used when the region is created; an existing region keeps
	// its own. Defaults: DefaultMaxOwners, DefaultMaxLanes,
	// DefaultMaxRecords, DefaultStringBytes, DefaultValueBytes.
	MaxOwners   int
	MaxLanes    int
	MaxRecords  int
	StringBytes int64
	ValueBytes  int64
	// Logger; default a null logger.
	Logger hclog.Logger
}

// DefaultPath is the default region file of a base-id:
// /dev/shm/hotproxy.<base-id>.stats.
func DefaultPath(baseID uint64) string {
	return filepath.Join("/dev/shm", "hotproxy."+strconv.FormatUint(baseID, 10)+".stats")
}

func (o *Options) withDefaults() Options {
	v := *o
	if v.Path == "" {
		v.Path = DefaultPath(v.BaseID)
	}
	if v.Mode == 0 {
		v.Mode = DefaultMode
	}
	if v.Lanes == 0 {
		v.Lanes = 1
	}
	if v.MaxOwners == 0 {
		v.MaxOwners = DefaultMaxOwners
	}
	if v.MaxLanes == 0 {
		v.MaxLanes = DefaultMaxLanes
	}
	if v.MaxRecords == 0 {
		v.MaxRecords = DefaultMaxRecords
	}
	if v.StringBytes == 0 {
		v.StringBytes = DefaultStringBytes
	}
	if v.ValueBytes == 0 {
		v.ValueBytes = DefaultValueBytes
	}
	if v.Logger == nil {
		v.Logger = hclog.NewNullLogger()
	}
	return v
}

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

// refreshIndexLocked validates and indexes the records published since the
// last call. Published records are immutable, so this needs no OFD lock.
// A record whose offsets or lengths do not check out is an error naming
// the path, never a panic.
func (r *Region) refreshIndexLocked() error {
	n, strUsed, valUsed, err := usedSizes(r.mem, r.g)
	if err != nil {
		return r.corrupt(err)
	}
	for i := uint64(len(r.known)); i < n; i++ {
		v, err := parseRecord(r.mem, r.g, i, strUsed, valUsed)
		if err != nil {
			return r.corrupt(err)
		}
		h := hashName(v.name)
		r.index[h] = append(r.index[h], uint32(i))
		r.known = append(r.known, v)
	}
	return nil
}

// lookupLocked finds name among the indexed records.
func (r *Region) lookupLocked(name string, kind Kind, mode GaugeMode) (RecordID, bool, error) {
	for _, i := range r.index[hashName(name)] {
		if r.known[i].name != name {
			continue
		}
		k, m := r.known[i].kind, r.known[i].mode
		if k != kind || (kind == KindGauge && m != mode) {
			return 0, true, fmt.Errorf("%w: %q is a %s (mode %s), asked for a %s (mode %s)", ErrKindMismatch, name, k, m, kind, mode)
		}
		return RecordID(i), true, nil
	}
	return 0, false, nil
}

// Lookup returns the record of name if it exists.
func (r *Region) Lookup(name string, kind Kind, mode GaugeMode) (id RecordID, found bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, false, os.ErrClosed
	}
	err = r.guardedLocked(true, func() error {
		if err := r.refreshIndexLocked(); err != nil {
			return err
		}
		id, found, err = r.lookupLocked(name, kind, mode)
		return err
	})
	return id, found, err
}

// allocLocked appends a record. The caller holds mu and the OFD
// allocation lock and has checked that name does not exist.
func (r *Region) allocLocked(name string, kind Kind, mode GaugeMode) (RecordID, error) {
	n, strUsed, valUsed, err := usedSizes(r.mem, r.g)
	if err != nil {
		return 0, r.corrupt(err)
	}
	if n != uint64(len(r.known)) {
		return 0, fmt.Errorf("shm: region %s: %d records published, %d indexed", r.path, n, len(r.known))
	}
	if n >= r.g.maxRecords {
		return 0, fmt.Errorf("%w: all %d records in use", ErrFull, r.g.maxRecords)
	}
	if uint64(len(name)) > r.g.stringBytes-strUsed {
		return 0, fmt.Errorf("%w: string table (%d bytes) has no room for a %d-byte name", ErrFull, r.g.stringBytes, len(name))
	}
	words := kind.valueWords()
	if words*8 > r.g.valueBytes-valUsed {
		return 0, fmt.Errorf("%w: value heap (%d bytes) has no room for a %s", ErrFull, r.g.valueBytes, kind)
	}
	seq := r.word(hSeq)
	atomic.AddUint64(seq, 1) // odd: allocating
	copy(r.mem[r.g.stringsOff+strUsed:], name)
	for w := uint64(0); w < words; w++ {
		r.st(r.g.valuesOff+valUsed+w*8, 0)
	}
	ro := r.g.record(n)
	r.mem[ro+rKind] = byte(kind)
	r.mem[ro+rMode] = byte(mode)
	r.st(ro+rHash, hashName(name))
	r.st(ro+rNameOff, strUsed)
	r.st(ro+rNameLen, uint64(len(name)))
	r.st(ro+rValueOff, valUsed)
	r.st(ro+rValueWords, words)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[ro+rState])), recordUsed)
	r.st(hStringsUsed, strUsed+uint64(len(name)))
	r.st(hValuesUsed, valUsed+words*8)
	r.st(hNRecords, n+1)
	atomic.AddUint64(seq, 1) // even: done
	return RecordID(n), nil
}

// knownLocked returns the validated copy of record id, indexing new
// records first if needed.
func (r *Region) knownLocked(id RecordID) (recordView, error) {
	if uint64(id) >= uint64(len(r.known)) {
		if err := r.refreshIndexLocked(); err != nil {
			return recordView{}, err
		}
		if uint64(id) >= uint64(len(r.known)) {
			return recordView{}, fmt.Errorf("shm: record %d does not exist", id)
		}
	}
	return r.known[id], nil
}

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
	return r.word(r.g.lane(r.slot, uint64(lane), uint64(id))), nil
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

// Heartbeat stores the current time in this owner's heartbeat word, and
// sets this owner's bit again in the records it declares where the bit was
// lost (a truncated region written back). Call it from the main
// goroutine's flush loop.
func (r *Region) Heartbeat() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.guardedLocked(true, func() error {
			r.st(r.g.owner(r.slot)+oHeartbeat, uint64(time.Now().UnixNano()))
			for id := range r.declared {
				r.setDeclaredLocked(id, true)
			}
			return nil
		})
	}
}

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

// guardedLocked runs fn, which touches the mapping, so that a truncation of
// the file under it is an error, not a crash: on a memory fault the file is
// restored (healLocked) and, if retry, fn runs once more. The caller holds
// mu; fn must release anything it takes with defer.
func (r *Region) guardedLocked(retry bool, fn func() error) error {
	err := guardFault(fn)
	if !isFault(err) {
		return err
	}
	if herr := r.healLocked(); herr != nil {
		return fmt.Errorf("shm: region %s: %w; restoring it: %w", r.path, err, herr)
	}
	if !retry {
		return fmt.Errorf("shm: region %s: %w (restored; this update was lost)", r.path, err)
	}
	if err = guardFault(fn); isFault(err) {
		return fmt.Errorf("shm: region %s: %w (again after restoring it)", r.path, err)
	}
	return err
}

// Truncations returns how many times this Region found its file truncated
// and restored its size (see Check).
func (r *Region) Truncations() uint64 { return r.truncations.Load() }

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
	err := guardFault(func() (err error) { s, err = readRetry(r.mem, r.g); return err })
	if isFault(err) {
		r.mu.Lock()
		r.healLocked()
		r.mu.Unlock()
		err = guardFault(func() (err error) { s, err = readRetry(r.mem, r.g); return err })
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

func readRetry(mem []byte, g geometry) (*Snapshot, error) {
	var err error
	for i := 0; i < readAttempts; i++ {
		var s *Snapshot
		s, err = decodeBody(mem, g)
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

func unsafePointer(mem []byte, off uint64) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
