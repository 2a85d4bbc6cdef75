package shm

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Snapshot is a consistent view of a region: every stat with its kind and
// value, and the owner table.
type Snapshot struct {
	Path         string // file the snapshot was read from ("" for Decode)
	Major, Minor uint32 // layout version of the region
	Seq          uint64 // allocation sequence number the snapshot is consistent with
	Owners       []Owner
	Stats        []Stat // in allocation order
}

// Owner is one entry of the owner table (one per live generation).
// State is OwnerDead when the entry says live but the kernel says its
// generation is gone (its owner lock is free): a SIGKILLed generation
// leaves its entry, heartbeat and gauges behind until the next one to
// attach folds them, and a reader must not take them for a live proxy.
type Owner struct {
	Slot      int
	State     OwnerState
	PID       int
	Epoch     uint64
	Start     time.Time
	Heartbeat time.Time
	Lanes     int
	// Declares: this owner keeps the declarations of its stats (layout
	// 1.2 and later), so Stat.Retired can be decided while it lives.
	Declares bool
}

// Stat is one stat and its current value.
type Stat struct {
	Name string
	Kind Kind
	Mode GaugeMode // gauges only
	// Counter is the value of a counter: retired total plus live lanes.
	Counter uint64
	// Gauge is the value of a gauge.
	Gauge int64
	// Histogram is the value of a histogram (nil for other kinds).
	Histogram *HistogramValue
	// Retired: no live generation declares this stat any more (a
	// listener or cluster that only an older config had). It is decided
	// only while every live owner keeps declarations (Owner.Declares):
	// with no live owner, or one of a layout before 1.2, no stat is
	// retired. Its value is still what it was.
	Retired bool
}

// Value returns the stat's scalar value: the counter, the gauge or the
// histogram's count.
func (s Stat) Value() float64 {
	switch s.Kind {
	case KindCounter:
		return float64(s.Counter)
	case KindGauge:
		return float64(s.Gauge)
	case KindHistogram:
		if s.Histogram != nil {
			return float64(s.Histogram.Count)
		}
	}
	return 0
}

// HistogramValue holds cumulative-since-creation bucket counts in the
// layout described at HistogramBuckets.
type HistogramValue struct {
	Buckets []uint64
	Sum     float64
	Count   uint64
}

// ErrBusy is returned (wrapped) when the region kept changing while being
// read, or stayed in the middle of an allocation or fold.
var ErrBusy = errors.New("shm: region busy")

// FormatError is returned for bytes that are not a valid region; it names
// what is wrong. Reader errors wrap it with the path and advice.
type FormatError struct {
	Reason string

	fault bool    // a memory fault caught by guardFault, not bad bytes
	addr  uintptr // the faulting address
	// full: the fault is the filesystem's, which had no page left for
	// the sparse file (explainFault), not a truncation.
	full *fullFilesystem
}

// fullFilesystem is the filesystem under a region, found full after a
// memory fault.
type fullFilesystem struct{ size, free uint64 }

func (e *FormatError) Error() string {
	if e.fault && e.full != nil {
		return fmt.Sprintf("memory fault at %#x on the mapping: the filesystem holding the region is full (%d bytes, %d free): "+
			"a page of the sparse region file could not be allocated (no space left on device; the file was not truncated). "+
			"Make that filesystem larger (for /dev/shm: mount -o remount,size=<bigger> /dev/shm, or the container's --shm-size), "+
			"free space in it, or lower the [stats] limits", e.addr, e.full.size, e.full.free)
	}
	if e.fault {
		return fmt.Sprintf("memory fault at %#x on the mapping: the file shrank while in use (truncated)", e.addr)
	}
	return "not a valid hotproxy stats region: " + e.Reason
}

// Unwrap makes errors.Is(err, syscall.ENOSPC) true for a full filesystem.
func (e *FormatError) Unwrap() error {
	if e.fault && e.full != nil {
		return syscall.ENOSPC
	}
	return nil
}

func formatErr(f string, a ...any) error { return &FormatError{Reason: fmt.Sprintf(f, a...)} }

// errNotReady is a FormatError-like condition that may pass: the region is
// being created.
var errNotReady = errors.New("region is not initialised yet (being created, or its creator died)")

// load reads the aligned word at off. The caller has checked the bounds.
func load(mem []byte, off uint64) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[off])))
}

func load32(mem []byte, off uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&mem[off])))
}

// parseHeader validates the header of mem and returns the geometry. It
// touches only the first HeaderSize bytes, and only if len(mem) allows.
func parseHeader(mem []byte) (geometry, error) {
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return geometry{}, errors.New("shm: region memory is not 8-byte aligned")
	}
	if len(mem) < HeaderSize {
		return geometry{}, formatErr("file is %d bytes, shorter than the %d-byte header (truncated)", len(mem), HeaderSize)
	}
	if m := load(mem, hMagic); m != Magic {
		return geometry{}, formatErr("bad magic %#016x", m)
	}
	if load(mem, hReady) != 1 {
		return geometry{}, errNotReady
	}
	major, minor := load32(mem, hVersion), load32(mem, hVersion+4)
	if major != LayoutMajor {
		return geometry{}, formatErr("layout version %d.%d, this build reads %d.x", major, minor, LayoutMajor)
	}
	if h := load(mem, hLayoutHash); h != LayoutHash {
		return geometry{}, formatErr("layout hash %#x, want %#x", h, LayoutHash)
	}
	g, err := computeGeometry(load(mem, hMaxOwners), load(mem, hMaxLanes), load(mem, hMaxRecords),
		load(mem, hStringBytes), load(mem, hValueBytes))
	if err != nil {
		return geometry{}, formatErr("capacities: %v", err)
	}
	for _, f := range []struct {
		off  uint64
		want uint64
		name string
	}{
		{hTotalSize, g.totalSize, "total size"},
		{hOwnersOff, g.ownersOff, "owners offset"},
		{hRecordsOff, g.recordsOff, "records offset"},
		{hStringsOff, g.stringsOff, "strings offset"},
		{hValuesOff, g.valuesOff, "values offset"},
		{hLanesOff, g.lanesOff, "lanes offset"},
		{hLaneStride, g.laneStride, "lane stride"},
	} {
		if v := load(mem, f.off); v != f.want {
			return geometry{}, formatErr("header %s is %d, want %d", f.name, v, f.want)
		}
	}
	if uint64(len(mem)) < g.totalSize {
		return geometry{}, formatErr("file is %d bytes but its header says %d (truncated)", len(mem), g.totalSize)
	}
	return g, nil
}

// Decode decodes a region from its bytes (for example a mapping of the
// region file). It never writes to mem and never panics on any input; mem
// must be 8-byte aligned. It does not retry: a region being modified may
// yield ErrBusy.
//
// Bytes alone cannot tell a dead owner from a live one (only the owner
// locks of the file can), so Decode takes every owner its table says is
// live at its word; Reader.Snapshot asks the kernel.
func Decode(mem []byte) (*Snapshot, error) {
	g, err := parseHeader(mem)
	if err != nil {
		return nil, err
	}
	return decodeBody(mem, g, nil)
}

// ownerDeadFunc reports whether the generation of owner slot s is gone
// although its entry says live (its owner lock is free). nil: none is.
type ownerDeadFunc func(slot uint64) bool

// decodeBody decodes the sections after parseHeader accepted the header.
// A decoding error met while the sequence number changed is reported as
// ErrBusy: it may be a torn read of a region being modified.
func decodeBody(mem []byte, g geometry, dead ownerDeadFunc) (*Snapshot, error) {
	seq := load(mem, hSeq)
	if seq&1 != 0 {
		return nil, fmt.Errorf("%w: allocation or fold in progress (seq %d)", ErrBusy, seq)
	}
	s, err := decodeSections(mem, g, seq, dead)
	if err != nil && load(mem, hSeq) != seq {
		return nil, fmt.Errorf("%w: changed while reading", ErrBusy)
	}
	return s, err
}

func decodeSections(mem []byte, g geometry, seq uint64, dead ownerDeadFunc) (*Snapshot, error) {
	s := &Snapshot{Major: load32(mem, hVersion), Minor: load32(mem, hVersion+4), Seq: seq}
	n, strUsed, valUsed, err := usedSizes(mem, g)
	if err != nil {
		return nil, err
	}

	// Owners: live ones contribute lanes; the newest live one feeds
	// GaugeNewest. A dead one (its entry says live, its lock is free)
	// still contributes its counter lanes, which the fold that retires
	// it adds to the retired totals (so a counter reads the same before
	// and after that fold), but no gauge: its connections are gone, and
	// its server.live must not say it serves.
	type liveOwner struct{ slot, lanes uint64 }
	var live, deadOwners []liveOwner
	var liveMask uint64 // bits of the live owners' slots
	allDeclare := true  // every live owner keeps declarations
	newest := -1
	var newestEpoch, newestStart uint64
	for i := uint64(0); i < g.maxOwners; i++ {
		o := g.owner(i)
		st, lanes, err := parseOwner(mem, g, i)
		if err != nil {
			return nil, err
		}
		if st == OwnerFree {
			continue
		}
		if st == OwnerLive && dead != nil && dead(i) {
			st = OwnerDead
		}
		ep, start := load(mem, o+oEpoch), load(mem, o+oStart)
		s.Owners = append(s.Owners, Owner{
			Slot: int(i), State: st, PID: int(int32(load(mem, o+oPID))), Epoch: ep,
			Start: time.Unix(0, int64(start)), Heartbeat: time.Unix(0, int64(load(mem, o+oHeartbeat))),
			Lanes: int(lanes), Declares: load(mem, o+oDeclares) == 1,
		})
		if st == OwnerDead {
			deadOwners = append(deadOwners, liveOwner{i, lanes})
		}
		if st != OwnerLive {
			continue
		}
		live = append(live, liveOwner{i, lanes})
		liveMask |= 1 << i
		allDeclare = allDeclare && load(mem, o+oDeclares) == 1
		if newest < 0 || ep > newestEpoch || (ep == newestEpoch && start > newestStart) {
			newest, newestEpoch, newestStart = len(live)-1, ep, start
		}
	}

	counted := append(live[:len(live):len(live)], deadOwners...) // counter lanes

	s.Stats = make([]Stat, 0, n)
	for i := uint64(0); i < n; i++ {
		rec, err := parseRecord(mem, g, i, strUsed, valUsed)
		if err != nil {
			return nil, err
		}
		kind, mode := rec.kind, rec.mode
		st := Stat{Name: rec.name, Kind: kind}
		st.Retired = len(live) > 0 && allDeclare && load(mem, g.record(i)+rDeclared)&liveMask == 0
		base := g.valuesOff + rec.valueOff
		switch kind {
		case KindCounter:
			v := load(mem, base)
			for _, o := range counted {
				for l := uint64(0); l < o.lanes; l++ {
					v += load(mem, g.lane(o.slot, l, i))
				}
			}
			st.Counter = v
		case KindGauge:
			st.Mode = mode
			var v uint64
			for j, o := range live {
				if mode == GaugeNewest && j != newest {
					continue
				}
				for l := uint64(0); l < o.lanes; l++ {
					v += load(mem, g.lane(o.slot, l, i))
				}
			}
			st.Gauge = int64(v)
		case KindHistogram:
			h := &HistogramValue{Buckets: make([]uint64, HistogramBuckets)}
			for b := range h.Buckets {
				h.Buckets[b] = load(mem, base+uint64(b)*8)
			}
			h.Sum = math.Float64frombits(load(mem, base+HistogramSumWord*8))
			h.Count = load(mem, base+HistogramCountWord*8)
			st.Histogram = h
		}
		s.Stats = append(s.Stats, st)
	}
	if load(mem, hSeq) != seq {
		return nil, fmt.Errorf("%w: changed while reading", ErrBusy)
	}
	return s, nil
}

// parseOwner validates owner slot i and returns its state and lane count.
func parseOwner(mem []byte, g geometry, i uint64) (OwnerState, uint64, error) {
	o := g.owner(i)
	st := OwnerState(load(mem, o+oState))
	switch st {
	case OwnerFree:
		return st, 0, nil
	case OwnerLive, OwnerFolding:
	default:
		return 0, 0, formatErr("owner %d has unknown state %d", i, uint64(st))
	}
	lanes := load(mem, o+oLanes)
	if lanes > g.maxLanes {
		return 0, 0, formatErr("owner %d has %d lanes, capacity %d", i, lanes, g.maxLanes)
	}
	if j := load(mem, o+oFoldJournal); j > g.maxRecords {
		return 0, 0, formatErr("owner %d fold journal names record %d, capacity %d", i, j, g.maxRecords)
	}
	return st, lanes, nil
}

// recordView is a validated copy of a record.
type recordView struct {
	name       string
	kind       Kind
	mode       GaugeMode // GaugeSum unless kind is KindGauge
	valueOff   uint64    // in the value heap, 8-aligned, words within valUsed
	valueWords uint64
}

// parseRecord validates record i against the used parts of the string
// table and value heap (strUsed and valUsed, already checked against their
// capacities) and copies it out. Every offset and length is checked before
// it is used, so a corrupt region is an error, never a panic. The writer
// (indexing, folding, histogram adds) and the reader share it.
func parseRecord(mem []byte, g geometry, i, strUsed, valUsed uint64) (recordView, error) {
	if i >= g.maxRecords {
		return recordView{}, formatErr("record %d beyond capacity %d", i, g.maxRecords)
	}
	r := g.record(i)
	if load32(mem, r+rState) != recordUsed {
		return recordView{}, formatErr("record %d is not in use", i)
	}
	v := recordView{kind: Kind(mem[r+rKind]), mode: GaugeMode(mem[r+rMode])}
	switch v.kind {
	case KindCounter, KindHistogram:
		v.mode = GaugeSum
	case KindGauge:
		if v.mode != GaugeSum && v.mode != GaugeNewest {
			return recordView{}, formatErr("record %d gauge mode %d", i, v.mode)
		}
	default:
		return recordView{}, formatErr("record %d has unknown kind %d", i, v.kind)
	}
	nameOff, nameLen := load(mem, r+rNameOff), load(mem, r+rNameLen)
	if nameOff > strUsed || nameLen > strUsed-nameOff {
		return recordView{}, formatErr("record %d name [%d,+%d) outside the used string table (%d bytes)", i, nameOff, nameLen, strUsed)
	}
	v.name = string(mem[g.stringsOff+nameOff : g.stringsOff+nameOff+nameLen])
	if hashName(v.name) != load(mem, r+rHash) {
		return recordView{}, formatErr("record %d name hash mismatch", i)
	}
	v.valueOff, v.valueWords = load(mem, r+rValueOff), load(mem, r+rValueWords)
	if v.valueWords != v.kind.valueWords() || v.valueOff%8 != 0 || v.valueOff > valUsed || v.valueWords*8 > valUsed-v.valueOff {
		return recordView{}, formatErr("record %d (%s) value [%d,+%d words) outside the used value heap (%d bytes)", i, v.kind, v.valueOff, v.valueWords, valUsed)
	}
	return v, nil
}

// usedSizes reads and validates the used sizes of the string table and
// value heap and the record count.
func usedSizes(mem []byte, g geometry) (n, strUsed, valUsed uint64, err error) {
	n = load(mem, hNRecords)
	if n > g.maxRecords {
		return 0, 0, 0, formatErr("record count %d exceeds capacity %d", n, g.maxRecords)
	}
	strUsed = load(mem, hStringsUsed)
	if strUsed > g.stringBytes {
		return 0, 0, 0, formatErr("string table use %d exceeds its size %d", strUsed, g.stringBytes)
	}
	valUsed = load(mem, hValuesUsed)
	if valUsed > g.valueBytes || valUsed%8 != 0 {
		return 0, 0, 0, formatErr("value heap use %d invalid (size %d, must be a multiple of 8)", valUsed, g.valueBytes)
	}
	return n, strUsed, valUsed, nil
}
