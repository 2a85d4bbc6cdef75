package shm

import (
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"
)

// seedRegion builds a small valid region with every kind of record and a
// live owner, and returns its bytes.
func seedRegion(tb testing.TB) []byte {
	tb.Helper()
	o := Options{Path: filepath.Join(tb.TempDir(), "seed.stats"), Lanes: 2, MaxOwners: 2, MaxLanes: 2,
		MaxRecords: 8, StringBytes: 256, ValueBytes: 8192}
	r, err := Open(o)
	if err != nil {
		tb.Fatal(err)
	}
	defer r.Close()
	c, _ := r.Alloc("listener.web.downstream_cx_total", KindCounter, 0)
	g, _ := r.Alloc("server.live", KindGauge, GaugeNewest)
	h, _ := r.Alloc("upstream.rq_time", KindHistogram, 0)
	p, _ := r.Lane(c, 1)
	atomic.AddUint64(p, 42)
	p, _ = r.Lane(g, 0)
	atomic.StoreUint64(p, 1)
	b := make([]uint64, HistogramBuckets)
	b[100] = 3
	r.AddHistogram(h, b, 0.25, 3)
	data, err := os.ReadFile(o.Path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// aligned copies data into 8-byte aligned memory, as a mapping is.
func aligned(data []byte) []byte {
	words := make([]uint64, (len(data)+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)[:len(data)]
	copy(mem, data)
	return mem
}

func TestDecodeSeed(t *testing.T) {
	s, err := Decode(aligned(seedRegion(t)))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Stats) != 3 || statOf(t, s, "listener.web.downstream_cx_total").Counter != 42 {
		t.Fatalf("%+v", s)
	}
}

// FuzzReader feeds random and mutated region bytes to the decoder: it must
// return a snapshot or an error, never panic or read out of bounds.
func FuzzReader(f *testing.F) {
	seed := seedRegion(f)
	f.Add(seed)
	f.Add(seed[:HeaderSize])
	f.Add(seed[:len(seed)-1])
	f.Add([]byte("HPXSTATS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		mem := aligned(data)
		s, err := Decode(mem)
		if err == nil && s == nil {
			t.Fatal("nil snapshot without error")
		}
	})
}

// seedMutations are (offset, value) pairs aimed at the owner table (state,
// lanes, fold journal), the name records (offset, length, hash, kind) and
// the string table, so that the fuzzers start where the decoders check
// offsets and lengths read from the region.
func seedMutations() [][2]uint64 {
	g, err := computeGeometry(2, 2, 8, 256, 8192) // seedRegion's capacities
	if err != nil {
		panic(err)
	}
	return [][2]uint64{
		{hNRecords, 1000},
		{hStringsUsed, 1 << 40},
		{hValuesUsed, 13},
		{g.owner(0) + oState, uint64(OwnerLive)},
		{g.owner(0) + oState, 77},
		{g.owner(0) + oLanes, 1 << 40},
		{g.owner(1) + oFoldJournal, 3},
		{g.owner(1) + oFoldCursor, 1 << 50},
		{g.record(0) + rNameOff, 1 << 40},
		{g.record(0) + rNameLen, 1 << 62},
		{g.record(1) + rNameOff, 250},
		{g.record(1) + rHash, 0},
		{g.record(2) + rValueOff, 1 << 60},
		{g.record(2) + rValueWords, 1},
		{g.record(0) + rState, 0x0303000000000001}, // kind 3 on a counter
		{g.stringsOff, 0x4141414141414141},
	}
}

// mutateWord stores v at the 8-aligned offset off (modulo len(mem)).
func mutateWord(mem []byte, off, v uint64) {
	if len(mem) < 8 {
		return
	}
	o := off % uint64(len(mem)-7) &^ 7
	*(*uint64)(unsafe.Pointer(&mem[o])) = v
}

// FuzzReaderMutateSeed mutates a few header, owner and record words of a
// valid region (the random corpus rarely gets past the magic).
func FuzzReaderMutateSeed(f *testing.F) {
	seed := seedRegion(f)
	for _, m := range seedMutations() {
		f.Add(uint32(m[0]), m[1], uint32(m[0]), m[1])
	}
	f.Fuzz(func(t *testing.T, off uint32, v uint64, off2 uint32, v2 uint64) {
		mem := aligned(seed)
		mutateWord(mem, uint64(off), v)
		mutateWord(mem, uint64(off2), v2)
		Decode(mem)
		// A file cut anywhere is an error, never a panic.
		cut := uint64(off) % uint64(len(mem))
		if _, err := Decode(mem[:cut]); err == nil {
			t.Fatalf("decoded a region cut at %d", cut)
		}
	})
}

// TestDecodeMutations runs the decoder over deterministic random mutations
// and cuts of a valid region, and over random bytes behind a valid magic,
// in every plain `go test` run (the fuzz targets explore further).
func TestDecodeMutations(t *testing.T) {
	seed := seedRegion(t)
	rng := rand.New(rand.NewSource(1))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	for i := 0; i < n; i++ {
		d := append([]byte(nil), seed...)
		for k := 0; k < 1+rng.Intn(8); k++ {
			switch rng.Intn(3) {
			case 0:
				d[rng.Intn(len(d))] = byte(rng.Intn(256))
			case 1: // a whole word in the header, owners or records
				if len(d) < 3*pageSize {
					continue
				}
				o := rng.Intn(3*pageSize/8) * 8
				for b := 0; b < 8; b++ {
					d[o+b] = byte(rng.Uint64() >> (8 * b))
				}
			case 2:
				d = d[:rng.Intn(len(d)+1)]
			}
			if len(d) == 0 {
				break
			}
		}
		Decode(aligned(d))
	}
	junk := make([]byte, 3*pageSize)
	for i := 0; i < 2000; i++ {
		rng.Read(junk)
		copy(junk, seed[:32])
		Decode(aligned(junk))
	}
}

// FuzzAttach writes a valid region with two words mutated to a file and
// attaches to it as a generation does (Open), then uses it: every mutation
// must give an error or a working region, never a panic or a fault.
func FuzzAttach(f *testing.F) {
	seed := seedRegion(f)
	for _, m := range seedMutations() {
		f.Add(uint32(m[0]), m[1], uint32(m[0]), m[1])
	}
	f.Add(uint32(hReady), uint64(0), uint32(0), uint64(Magic))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, off uint32, v uint64, off2 uint32, v2 uint64) {
		mem := aligned(seed)
		mutateWord(mem, uint64(off), v)
		mutateWord(mem, uint64(off2), v2)
		path := filepath.Join(dir, "attach.stats")
		if err := os.WriteFile(path, mem, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Open(Options{Path: path, Lanes: 2, MaxOwners: 2, MaxLanes: 2,
			MaxRecords: 8, StringBytes: 256, ValueBytes: 8192})
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		defer r.Close()
		for _, name := range []string{"listener.web.downstream_cx_total", "server.live", "upstream.rq_time", "new.stat"} {
			r.Lookup(name, KindCounter, 0)
			if id, err := r.Alloc(name, KindCounter, 0); err == nil {
				if p, err := r.Lane(id, 1); err == nil {
					atomic.AddUint64(p, 1)
				}
			}
		}
		if id, err := r.Alloc("upstream.rq_time", KindHistogram, 0); err == nil {
			r.AddHistogram(id, []uint64{1, 2, 3}, 1.5, 6)
		}
		r.Snapshot()
		r.Reap()
		r.Check()
	})
}
