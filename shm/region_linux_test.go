package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// smallOptions returns options for a small region in a temp dir.
func smallOptions(tb testing.TB) Options {
	tb.Helper()
	return Options{
		Path:        filepath.Join(tb.TempDir(), "test.stats"),
		Lanes:       3,
		MaxOwners:   3,
		MaxLanes:    4,
		MaxRecords:  64,
		StringBytes: 4096,
		ValueBytes:  64 << 10,
	}
}

func openRegion(tb testing.TB, o Options) *Region {
	tb.Helper()
	r, err := Open(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

func openReader(tb testing.TB, path string) *Reader {
	tb.Helper()
	rd, err := OpenReader(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rd.Close() })
	return rd
}

func statOf(tb testing.TB, s *Snapshot, name string) Stat {
	tb.Helper()
	for _, st := range s.Stats {
		if st.Name == name {
			return st
		}
	}
	tb.Fatalf("stat %q not in snapshot", name)
	return Stat{}
}

func lane(tb testing.TB, r *Region, id RecordID, l int) *uint64 {
	tb.Helper()
	p, err := r.Lane(id, l)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestCountersSurviveCloseAndDeath(t *testing.T) {
	o := smallOptions(t)
	a := openRegion(t, o)
	ca, err := a.Alloc("c", KindCounter, 0)
	if err != nil {
		t.Fatal(err)
	}
	ga, _ := a.Alloc("g", KindGauge, GaugeSum)
	na, _ := a.Alloc("live", KindGauge, GaugeNewest)
	atomic.AddUint64(lane(t, a, ca, 0), 5)
	atomic.AddUint64(lane(t, a, ca, 2), 7)
	atomic.AddUint64(lane(t, a, ga, 1), 3)
	atomic.StoreUint64(lane(t, a, na, 0), 1)

	o.Epoch = 1
	b := openRegion(t, o)
	cb, _ := b.Alloc("c", KindCounter, 0)
	if cb != ca {
		t.Fatalf("second owner got record %d, want %d", cb, ca)
	}
	atomic.AddUint64(lane(t, b, cb, 1), 100)
	gb, _ := b.Alloc("g", KindGauge, GaugeSum)
	atomic.AddUint64(lane(t, b, gb, 0), 2)
	nb, _ := b.Alloc("live", KindGauge, GaugeNewest)
	atomic.StoreUint64(lane(t, b, nb, 0), 1)

	rd := openReader(t, o.Path)
	s, err := rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := statOf(t, s, "c").Counter; v != 112 {
		t.Fatalf("counter = %d, want 112", v)
	}
	if v := statOf(t, s, "g").Gauge; v != 5 {
		t.Fatalf("gauge = %d, want 5", v)
	}
	if v := statOf(t, s, "live").Gauge; v != 1 {
		t.Fatalf("newest gauge = %d, want 1", v)
	}
	if len(s.Owners) != 2 {
		t.Fatalf("owners = %+v", s.Owners)
	}

	a.abandon() // dies: nobody folded it yet; its lanes stop counting for gauges once folded
	o.Epoch = 2
	c := openRegion(t, o) // notices and folds a
	s, err = rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := statOf(t, s, "c").Counter; v != 112 {
		t.Fatalf("counter after fold = %d, want 112", v)
	}
	if v := statOf(t, s, "g").Gauge; v != 2 {
		t.Fatalf("gauge after fold = %d, want 2", v)
	}
	if len(s.Owners) != 2 {
		t.Fatalf("owners after fold = %+v", s.Owners)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := statOf(t, s, "c").Counter; v != 112 {
		t.Fatalf("counter after close = %d, want 112", v)
	}
	if v := statOf(t, s, "g").Gauge; v != 0 {
		t.Fatalf("gauge after close = %d, want 0", v)
	}
	if len(s.Owners) != 0 {
		t.Fatalf("owners after close = %+v", s.Owners)
	}
}

func TestAllocErrors(t *testing.T) {
	o := smallOptions(t)
	o.MaxRecords = 2
	r := openRegion(t, o)
	if _, err := r.Alloc("a", KindCounter, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Alloc("a", KindGauge, GaugeSum); !errors.Is(err, ErrKindMismatch) {
		t.Fatalf("kind mismatch: %v", err)
	}
	long := strings.Repeat("x", 3000)
	if _, err := r.Alloc(long, KindHistogram, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Alloc("c", KindCounter, 0); !errors.Is(err, ErrFull) {
		t.Fatalf("full: %v", err)
	}
	h, _ := r.Alloc(long, KindHistogram, 0)
	b := make([]uint64, HistogramBuckets)
	b[3], b[HistogramBuckets-1] = 2, 1
	if err := r.AddHistogram(h, b, 1.5, 3); err != nil {
		t.Fatal(err)
	}
	s, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	hv := statOf(t, s, long).Histogram
	if hv.Count != 3 || hv.Sum != 1.5 || hv.Buckets[3] != 2 || hv.Buckets[HistogramBuckets-1] != 1 {
		t.Fatalf("histogram = %+v", hv)
	}
	if _, err := r.Lane(h, 0); !errors.Is(err, ErrKindMismatch) {
		t.Fatalf("lane of histogram: %v", err)
	}
	if _, err := r.Lane(0, 3); err == nil {
		t.Fatal("lane out of range accepted")
	}
}

func TestOwnerSlotsExhausted(t *testing.T) {
	o := smallOptions(t)
	o.MaxOwners = 1
	openRegion(t, o)
	if _, err := Open(o); !errors.Is(err, ErrNoOwnerSlot) {
		t.Fatalf("second owner: %v", err)
	}
}

// TestRefuseBadFiles: Open and OpenReader refuse truncated, foreign and
// other-version files with an error naming the path, and leave them as they
// were.
func TestRefuseBadFiles(t *testing.T) {
	o := smallOptions(t)
	r := openRegion(t, o)
	r.Alloc("x", KindCounter, 0)
	r.Close()
	valid, err := os.ReadFile(o.Path)
	if err != nil {
		t.Fatal(err)
	}
	major := append([]byte(nil), valid...)
	major[hVersion] = LayoutMajor + 1
	cases := map[string][]byte{
		"truncated-header": valid[:100],
		"truncated-body":   valid[:len(valid)/2],
		"foreign":          []byte(strings.Repeat("not a region at all\n", 400)),
		"other-major":      major,
		"zero":             make([]byte, 8192),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			oo := o
			oo.Path = p
			if _, err := Open(oo); err == nil || !strings.Contains(err.Error(), p) {
				t.Fatalf("Open: %v", err)
			} else {
				t.Log(err)
			}
			if rd, err := OpenReader(p); err == nil {
				_, err = rd.Snapshot()
				rd.Close()
				if err == nil {
					t.Fatal("reader accepted it")
				}
			} else if !strings.Contains(err.Error(), p) {
				t.Fatalf("OpenReader error does not name the path: %v", err)
			}
			after, _ := os.ReadFile(p)
			if string(after) != string(data) {
				t.Fatal("file was modified")
			}
		})
	}
}

func TestRefuseOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a file owned by another user")
	}
	o := smallOptions(t)
	if err := os.WriteFile(o.Path, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(o.Path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("Open: %v", err)
	}
	if fi, _ := os.Stat(o.Path); fi.Size() != 0 {
		t.Fatal("file was modified")
	}
}

func TestFileModeAndHalfCreated(t *testing.T) {
	o := smallOptions(t)
	o.Mode = 0o600
	r := openRegion(t, o)
	r.Close()
	fi, err := os.Stat(o.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// Magic but not ready: its creator died; the next Open recreates it.
	data, _ := os.ReadFile(o.Path)
	data[hReady] = 0
	os.WriteFile(o.Path, data, 0o600)
	if _, err := OpenReader(o.Path); err == nil || !strings.Contains(err.Error(), "not initialised") {
		t.Fatalf("reader on half-created: %v", err)
	}
	openRegion(t, o)
}

// TestReaderTruncatedUnderneath: a file truncated after the reader mapped
// it gives an error, not a SIGBUS.
func TestReaderTruncatedUnderneath(t *testing.T) {
	o := smallOptions(t)
	r := openRegion(t, o)
	r.Alloc("x", KindCounter, 0)
	rd := openReader(t, o.Path)
	if _, err := rd.Snapshot(); err != nil {
		t.Fatal(err)
	}
	r.stopWatch() // the writer would restore the file at once
	if err := os.Truncate(o.Path, HeaderSize+10); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Snapshot(); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("snapshot of truncated: %v", err)
	}
	// Even bypassing the size check, a fault becomes an error.
	err := guardFault(func() error { _ = load(rd.mem, uint64(len(rd.mem))-8); return nil })
	if err == nil {
		t.Fatal("no fault reported")
	}
}

// TestReaderMonotonicDuringFolds: a reader that runs while owners die and
// are folded, close and fold, and records are allocated, never sees a
// counter total go backwards, and ends on the exact total.
func TestReaderMonotonicDuringFolds(t *testing.T) {
	o := smallOptions(t)
	o.MaxRecords = 512
	o.StringBytes = 64 << 10
	keeper := openRegion(t, o) // the region stays alive throughout
	id, _ := keeper.Alloc("total", KindCounter, 0)
	rd := openReader(t, o.Path)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, errs atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := rd.Snapshot()
			if err != nil {
				errs.Add(1)
				t.Errorf("snapshot: %v", err)
				return
			}
			reads.Add(1)
			v := statOf(t, s, "total").Counter
			if v < last {
				t.Errorf("counter went backwards: %d after %d", v, last)
				return
			}
			last = v
		}
	}()

	const rounds, perLane = 200, 1000
	for i := 0; i < rounds; i++ {
		oo := o
		oo.Epoch = uint64(i)
		g, err := Open(oo)
		if err != nil {
			t.Fatal(err)
		}
		gid, err := g.Alloc("total", KindCounter, 0)
		if err != nil || gid != id {
			t.Fatal(gid, err)
		}
		for l := 0; l < oo.Lanes; l++ {
			p := lane(t, g, gid, l)
			for k := 0; k < perLane; k++ {
				atomic.AddUint64(p, 1)
			}
		}
		if _, err := g.Alloc("extra."+string(rune('a'+i%26))+strings.Repeat("x", i), KindCounter, 0); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			g.abandon() // died: folded by the next Open
		} else if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
	keeper.Reap()
	close(stop)
	wg.Wait()
	s, err := rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v, want := statOf(t, s, "total").Counter, uint64(rounds*o.Lanes*perLane); v != want {
		t.Fatalf("total = %d, want %d", v, want)
	}
	t.Logf("%d concurrent snapshots, %d errors", reads.Load(), errs.Load())
}

// TestFoldJournalReplay: a folder that dies after committing a record's
// fold but before applying it is finished exactly once by the next.
func TestFoldJournalReplay(t *testing.T) {
	o := smallOptions(t)
	a := openRegion(t, o)
	id, _ := a.Alloc("c", KindCounter, 0)
	atomic.AddUint64(lane(t, a, id, 1), 10)
	// Simulate: fold of record 0 committed (journal) but not applied.
	ob := a.g.owner(a.slot)
	atomic.AddUint64(a.word(hSeq), 1)
	a.st(ob+oState, uint64(OwnerFolding))
	a.st(ob+oFoldNew, 10)
	a.st(ob+oFoldJournal, uint64(id)+1)
	a.abandon()
	b := openRegion(t, o)
	s, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v := statOf(t, s, "c").Counter; v != 10 {
		t.Fatalf("counter = %d, want 10", v)
	}
}

// TestDeadOwnerReadsDead: a generation that dies without folding (its
// owner lock freed by the kernel) leaves its entry saying live. A reader
// reports it dead at once, before anyone folds it: its gauges no longer
// count (a newest gauge such as server.live falls to the newest owner
// still alive, or 0), its counters still do (the fold adds them to the
// retired totals, so the value does not jump).
func TestDeadOwnerReadsDead(t *testing.T) {
	o := smallOptions(t)
	older := openRegion(t, o)
	c0, _ := older.Alloc("c", KindCounter, 0)
	g0, _ := older.Alloc("g", KindGauge, GaugeSum)
	n0, _ := older.Alloc("live", KindGauge, GaugeNewest)
	atomic.AddUint64(lane(t, older, c0, 0), 5)
	atomic.AddUint64(lane(t, older, g0, 0), 3)
	atomic.StoreUint64(lane(t, older, n0, 0), 0) // draining

	o.Epoch = 1
	newer := openRegion(t, o)
	c1, _ := newer.Alloc("c", KindCounter, 0)
	g1, _ := newer.Alloc("g", KindGauge, GaugeSum)
	n1, _ := newer.Alloc("live", KindGauge, GaugeNewest)
	atomic.AddUint64(lane(t, newer, c1, 0), 7)
	atomic.AddUint64(lane(t, newer, g1, 0), 2)
	atomic.StoreUint64(lane(t, newer, n1, 0), 1)

	rd := openReader(t, o.Path)
	read := func() *Snapshot {
		t.Helper()
		s, err := rd.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	states := func(s *Snapshot) map[uint64]OwnerState {
		m := map[uint64]OwnerState{}
		for _, ow := range s.Owners {
			m[ow.Epoch] = ow.State
		}
		return m
	}
	s := read()
	if st := states(s); st[0] != OwnerLive || st[1] != OwnerLive {
		t.Fatalf("both alive: states %v", st)
	}
	if v := statOf(t, s, "live").Gauge; v != 1 {
		t.Fatalf("live = %d, want 1", v)
	}

	newer.abandon() // the serving one dies; nobody folds it
	s = read()
	if st := states(s); st[0] != OwnerLive || st[1] != OwnerDead {
		t.Fatalf("after the newer one died: states %v, want epoch 0 live, epoch 1 dead", st)
	}
	if v := statOf(t, s, "live").Gauge; v != 0 {
		t.Fatalf("live = %d after the serving generation died, want 0 (the older one drains)", v)
	}
	if v := statOf(t, s, "g").Gauge; v != 3 {
		t.Fatalf("gauge = %d, want 3 (the dead one's 2 dropped)", v)
	}
	if v := statOf(t, s, "c").Counter; v != 12 {
		t.Fatalf("counter = %d, want 12 (a dead owner's counts still count)", v)
	}
	if OwnerDead.String() != "dead" {
		t.Fatalf("OwnerDead prints %q", OwnerDead.String())
	}

	older.abandon()
	s = read()
	if st := states(s); st[0] != OwnerDead || st[1] != OwnerDead {
		t.Fatalf("after both died: states %v", st)
	}
	if v := statOf(t, s, "live").Gauge; v != 0 {
		t.Fatalf("live = %d with no live owner, want 0", v)
	}
	if v := statOf(t, s, "c").Counter; v != 12 {
		t.Fatalf("counter = %d, want 12", v)
	}
}
