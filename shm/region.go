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
	log         hclog.Logger

	// mu guards index, indexed and closed, and serialises allocation
	// within this process (an OFD lock does not exclude goroutines that
	// share the open file).
	mu      sync.Mutex
	index   map[uint64][]uint32 // name hash -> record indexes below indexed
	indexed uint64
	closed  bool
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

// refreshIndexLocked indexes records published since the last call.
// Published records are immutable, so this needs no OFD lock.
func (r *Region) refreshIndexLocked() {
	n := r.ld(hNRecords)
	if n > r.g.maxRecords {
		n = r.g.maxRecords
	}
	for ; r.indexed < n; r.indexed++ {
		h := r.ld(r.g.record(r.indexed) + rHash)
		r.index[h] = append(r.index[h], uint32(r.indexed))
	}
}

func (r *Region) recordName(i uint64) string {
	ro := r.g.record(i)
	off, n := r.ld(ro+rNameOff), r.ld(ro+rNameLen)
	return string(r.mem[r.g.stringsOff+off : r.g.stringsOff+off+n])
}

// lookupLocked finds name among the indexed records.
func (r *Region) lookupLocked(name string, kind Kind, mode GaugeMode) (RecordID, bool, error) {
	for _, i := range r.index[hashName(name)] {
		if r.recordName(uint64(i)) != name {
			continue
		}
		ro := r.g.record(uint64(i))
		k, m := Kind(r.mem[ro+rKind]), GaugeMode(r.mem[ro+rMode])
		if k != kind || (kind == KindGauge && m != mode) {
			return 0, true, fmt.Errorf("%w: %q is a %s (mode %s), asked for a %s (mode %s)", ErrKindMismatch, name, k, m, kind, mode)
		}
		return RecordID(i), true, nil
	}
	return 0, false, nil
}

// Lookup returns the record of name if it exists.
func (r *Region) Lookup(name string, kind Kind, mode GaugeMode) (RecordID, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, false, os.ErrClosed
	}
	r.refreshIndexLocked()
	return r.lookupLocked(name, kind, mode)
}

// allocLocked appends a record. The caller holds mu and the OFD
// allocation lock and has checked that name does not exist.
func (r *Region) allocLocked(name string, kind Kind, mode GaugeMode) (RecordID, error) {
	n := r.ld(hNRecords)
	if n >= r.g.maxRecords {
		return 0, fmt.Errorf("%w: all %d records in use", ErrFull, r.g.maxRecords)
	}
	strUsed, valUsed := r.ld(hStringsUsed), r.ld(hValuesUsed)
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

func (r *Region) checkRecord(id RecordID, kind Kind) error {
	if uint64(id) >= r.ld(hNRecords) {
		return fmt.Errorf("shm: record %d does not exist", id)
	}
	if k := Kind(r.mem[r.g.record(uint64(id))+rKind]); k != kind {
		return fmt.Errorf("%w: record %d is a %s", ErrKindMismatch, id, k)
	}
	return nil
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
	if uint64(id) >= r.ld(hNRecords) {
		return nil, fmt.Errorf("shm: record %d does not exist", id)
	}
	ro := r.g.record(uint64(id))
	if k := Kind(r.mem[ro+rKind]); k != KindCounter && k != KindGauge {
		return nil, fmt.Errorf("%w: record %d is a %s, which has no lanes", ErrKindMismatch, id, k)
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
	if err := r.checkRecord(id, KindHistogram); err != nil {
		return err
	}
	if len(buckets) > HistogramBuckets {
		return fmt.Errorf("shm: %d histogram buckets, at most %d", len(buckets), HistogramBuckets)
	}
	base := r.g.valuesOff + r.ld(r.g.record(uint64(id))+rValueOff)
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

// Heartbeat stores the current time in this owner's heartbeat word. Call it
// from the main goroutine's flush loop.
func (r *Region) Heartbeat() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.st(r.g.owner(r.slot)+oHeartbeat, uint64(time.Now().UnixNano()))
	}
}

// Snapshot reads the region like a Reader does (without locking or
// writing), retrying while it changes.
func (r *Region) Snapshot() (*Snapshot, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, os.ErrClosed
	}
	s, err := readRetry(r.mem, r.g)
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
