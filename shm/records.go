package shm

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"
)

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
	// Even again when done, and also when a memory fault cuts the writes
	// below short (a full tmpfs has no page for the name or the values:
	// guardFault recovers it up the stack, and this defer runs on the
	// way). The record is not published then (hNRecords unchanged), as
	// repairLocked assumes of an odd sequence; left odd, every reader
	// would find the region busy until the next generation repaired it.
	defer atomic.AddUint64(seq, 1)
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
