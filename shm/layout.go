package shm

import (
	"fmt"
	"hash/fnv"
)

// Layout version. A minor bump adds fields in reserved space that old
// readers may ignore; a major bump changes the meaning or place of existing
// bytes, and a region of another major version is refused. See LAYOUT.md.
const (
	LayoutMajor = 1
	LayoutMinor = 2
)

// Magic is the first 8 bytes of a region file ("HPXSTATS", little-endian).
const Magic uint64 = 0x5354415453585048

// Fixed sizes of the layout, in bytes.
const (
	HeaderSize = 4096
	OwnerSize  = 128
	RecordSize = 64
	pageSize   = 4096
)

// Histogram block layout: HistogramBuckets bucket counts (bucket 0 counts
// values below the smallest range, the last one values at or above the
// largest, the ones in between are the VictoriaMetrics vmrange buckets,
// 18 per power of ten from 1e-9 to 1e18), then the sum (float64 bits),
// then the count.
const (
	HistogramDecades       = 27 // 1e-9 .. 1e18
	HistogramPerDecade     = 18
	HistogramRangeBuckets  = HistogramDecades * HistogramPerDecade
	HistogramBuckets       = HistogramRangeBuckets + 2
	HistogramWords         = HistogramBuckets + 2
	HistogramSumWord       = HistogramBuckets
	HistogramCountWord     = HistogramBuckets + 1
	histogramLayoutComment = "lower,vmrange[27x18 from 1e-9],upper,sum(f64),count"
)

// Header field offsets.
const (
	hMagic       = 0
	hVersion     = 8 // major uint32 at 8, minor uint32 at 12
	hLayoutHash  = 16
	hReady       = 24
	hTotalSize   = 32
	hMaxOwners   = 40
	hMaxLanes    = 48
	hMaxRecords  = 56
	hStringBytes = 64
	hValueBytes  = 72
	hOwnersOff   = 80
	hRecordsOff  = 88
	hStringsOff  = 96
	hValuesOff   = 104
	hLanesOff    = 112
	hLaneStride  = 120
	hSeq         = 128
	hNRecords    = 136
	hStringsUsed = 144
	hValuesUsed  = 152
	hCreated     = 160
	hHealStamp   = 168 // since 1.1: set when a generation restores a truncated region
)

// Owner entry field offsets.
const (
	oState       = 0
	oPID         = 8
	oEpoch       = 16
	oStart       = 24
	oHeartbeat   = 32
	oLanes       = 40
	oFoldCursor  = 48
	oFoldJournal = 56 // record index + 1 whose fold is committed but maybe not applied
	oFoldNew     = 64 // retired total to store for that record
	oDeclares    = 72 // since 1.2: 1 when this owner keeps its bit of every record's rDeclared
)

// Record field offsets.
const (
	rState      = 0 // uint32; kind uint8 at 4, gauge mode uint8 at 5
	rKind       = 4
	rMode       = 5
	rHash       = 8
	rNameOff    = 16
	rNameLen    = 24
	rValueOff   = 32
	rValueWords = 40
	// rDeclared, since 1.2: bit s is set while the generation in owner
	// slot s declares the stat (its config has the listener or cluster).
	// The only record word that changes after publication; atomic OR and
	// AND only.
	rDeclared = 48
)

// Record and owner states.
const (
	recordFree = 0
	recordUsed = 1
)

// Limits on capacities, so that size arithmetic never overflows and a
// foreign header cannot make a reader allocate without bound.
const (
	maxOwnersLimit  = 64
	maxLanesLimit   = 4096
	maxRecordsLimit = 1 << 22
	maxStringsLimit = 1 << 32
	maxValuesLimit  = 1 << 34
	maxTotalSize    = 1 << 40
	ownerLockBase   = 1 << 32 // OFD lock byte of owner slot i is ownerLockBase+i
	allocLockOffset = 0
)

// Default capacities and file mode (see Options).
const (
	DefaultMaxOwners   = 4
	DefaultMaxLanes    = 128
	DefaultMaxRecords  = 16384
	DefaultStringBytes = 4 << 20
	DefaultValueBytes  = 16 << 20
	DefaultMode        = 0o640
)

// Kind is the kind of a stat record.
type Kind uint8

// Kinds of records.
const (
	KindCounter   Kind = 1
	KindGauge     Kind = 2
	KindHistogram Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindCounter:
		return "counter"
	case KindGauge:
		return "gauge"
	case KindHistogram:
		return "histogram"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// valueWords is the number of retired/value words a record of kind k owns.
func (k Kind) valueWords() uint64 {
	switch k {
	case KindCounter:
		return 1
	case KindHistogram:
		return HistogramWords
	}
	return 0
}

// GaugeMode says how a gauge adds up across live generations.
type GaugeMode uint8

const (
	// GaugeSum sums the lanes of all live generations (e.g. connections in
	// flight: the draining and the new generation both have some).
	GaugeSum GaugeMode = 0
	// GaugeNewest takes the lanes of the newest live generation only
	// (highest epoch, then latest start), e.g. server.live.
	GaugeNewest GaugeMode = 1
)

func (m GaugeMode) String() string {
	switch m {
	case GaugeSum:
		return "sum"
	case GaugeNewest:
		return "newest"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// OwnerState is the state of an owner slot.
type OwnerState uint64

// Owner states.
const (
	OwnerFree    OwnerState = 0
	OwnerLive    OwnerState = 1
	OwnerFolding OwnerState = 2
	// OwnerDead is never stored: a reader reports it for an entry that
	// says live while its owner lock is free (the generation exited
	// without folding, or was killed). The next generation to attach
	// folds it.
	OwnerDead OwnerState = 3
)

func (s OwnerState) String() string {
	switch s {
	case OwnerFree:
		return "free"
	case OwnerLive:
		return "live"
	case OwnerFolding:
		return "folding"
	case OwnerDead:
		return "dead"
	}
	return fmt.Sprintf("state(%d)", uint64(s))
}

// LayoutHash identifies the fixed structure of layout major version 1. It
// must not change on a minor bump.
var LayoutHash = func() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "hotproxy-shm major=%d header=%d owner=%d record=%d hist=%d:%s",
		LayoutMajor, HeaderSize, OwnerSize, RecordSize, HistogramWords, histogramLayoutComment)
	return h.Sum64()
}()

// geometry is the section layout derived from the capacities.
type geometry struct {
	maxOwners, maxLanes, maxRecords uint64
	stringBytes, valueBytes         uint64
	ownersOff, recordsOff           uint64
	stringsOff, valuesOff, lanesOff uint64
	laneStride, totalSize           uint64
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

// computeGeometry lays out the sections for the given capacities. It
// returns an error if a capacity is out of range.
func computeGeometry(owners, lanes, records, strs, vals uint64) (geometry, error) {
	switch {
	case owners < 1 || owners > maxOwnersLimit:
		return geometry{}, fmt.Errorf("owners %d out of range [1,%d]", owners, maxOwnersLimit)
	case lanes < 1 || lanes > maxLanesLimit:
		return geometry{}, fmt.Errorf("lanes %d out of range [1,%d]", lanes, maxLanesLimit)
	case records < 1 || records > maxRecordsLimit:
		return geometry{}, fmt.Errorf("records %d out of range [1,%d]", records, maxRecordsLimit)
	case strs < 1 || strs > maxStringsLimit:
		return geometry{}, fmt.Errorf("string bytes %d out of range [1,%d]", strs, uint64(maxStringsLimit))
	case vals < 8 || vals > maxValuesLimit:
		return geometry{}, fmt.Errorf("value bytes %d out of range [8,%d]", vals, uint64(maxValuesLimit))
	}
	g := geometry{maxOwners: owners, maxLanes: lanes, maxRecords: records,
		stringBytes: roundUp(strs, pageSize), valueBytes: roundUp(vals, pageSize)}
	g.ownersOff = HeaderSize
	g.recordsOff = g.ownersOff + roundUp(owners*OwnerSize, pageSize)
	g.stringsOff = g.recordsOff + roundUp(records*RecordSize, pageSize)
	g.valuesOff = g.stringsOff + g.stringBytes
	g.lanesOff = g.valuesOff + g.valueBytes
	g.laneStride = roundUp(records*8, pageSize)
	g.totalSize = g.lanesOff + owners*lanes*g.laneStride
	if g.totalSize > maxTotalSize {
		return geometry{}, fmt.Errorf("total size %d exceeds %d", g.totalSize, uint64(maxTotalSize))
	}
	return g, nil
}

func (g geometry) owner(slot uint64) uint64 { return g.ownersOff + slot*OwnerSize }
func (g geometry) record(i uint64) uint64   { return g.recordsOff + i*RecordSize }
func (g geometry) lane(slot, lane, rec uint64) uint64 {
	return g.lanesOff + (slot*g.maxLanes+lane)*g.laneStride + rec*8
}

// hashName is the record lookup hash (FNV-1a 64).
func hashName(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}
