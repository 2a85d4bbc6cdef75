package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// shmPath returns a region path on /dev/shm (tmpfs, as in production),
// removed at the end of the test.
func shmPath(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		tb.Skip("no /dev/shm on this machine")
	}
	p := filepath.Join("/dev/shm", "hotproxy-test-"+filepath.Base(tb.TempDir())+".stats")
	tb.Cleanup(func() { os.Remove(p) })
	return p
}

// waitFor polls cond every millisecond for up to 5s.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTruncatedRegionIsRestored: truncating the region file of a live
// generation, to zero or in the middle of its records, is noticed by the
// watcher, which restores the size, the header, the records and the owner
// entry: the lanes are writable again without a fault, the region reads
// and another generation attaches. The counter values in the lost part
// start again from zero.
func TestTruncatedRegionIsRestored(t *testing.T) {
	for _, cut := range []string{"zero", "records", "lanes"} {
		t.Run(cut, func(t *testing.T) {
			o := smallOptions(t)
			o.Path = shmPath(t)
			r := openRegion(t, o)
			c, _ := r.Alloc("c", KindCounter, 0)
			gauge, _ := r.Alloc("g", KindGauge, GaugeNewest)
			h, _ := r.Alloc("h", KindHistogram, 0)
			pc := lane(t, r, c, 1)
			atomic.AddUint64(pc, 5)

			size := map[string]int64{"zero": 0, "records": int64(r.g.recordsOff + RecordSize), "lanes": int64(r.g.lanesOff + 8)}[cut]
			if err := os.Truncate(o.Path, size); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the watcher to restore the file", func() bool {
				fi, err := os.Stat(o.Path)
				return err == nil && uint64(fi.Size()) == r.g.totalSize && r.Truncations() == 1
			})
			// Check is what the flush does; it waits for the watcher's
			// rebuild (same lock) and must find nothing left to do.
			if err := r.Check(); err != nil {
				t.Fatal(err)
			}
			atomic.AddUint64(pc, 2) // would be a SIGBUS without the restore
			atomic.StoreUint64(lane(t, r, gauge, 0), 7)
			if err := r.AddHistogram(h, []uint64{0, 3}, 1, 3); err != nil {
				t.Fatal(err)
			}
			rd := openReader(t, o.Path)
			s, err := rd.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if got := statOf(t, s, "c").Counter; got != 2 {
				t.Errorf("counter after the truncation: %d, want 2 (the 5 before were in the lost pages)", got)
			}
			if got := statOf(t, s, "g").Gauge; got != 7 {
				t.Errorf("gauge: %d, want 7", got)
			}
			if got := statOf(t, s, "h").Histogram.Count; got != 3 {
				t.Errorf("histogram count: %d, want 3", got)
			}
			if len(s.Owners) != 1 || s.Owners[0].State != OwnerLive || s.Owners[0].PID != os.Getpid() {
				t.Errorf("owners: %+v", s.Owners)
			}
			// A new generation attaches, sees the same records, and its
			// counts add up with ours.
			o2 := o
			o2.Epoch = 1
			r2 := openRegion(t, o2)
			c2, err := r2.Alloc("c", KindCounter, 0)
			if err != nil || c2 != c {
				t.Fatalf("second generation: record %d, %v; want %d", c2, err, c)
			}
			atomic.AddUint64(lane(t, r2, c2, 0), 10)
			if s, err = rd.Snapshot(); err != nil {
				t.Fatal(err)
			}
			if got := statOf(t, s, "c").Counter; got != 12 {
				t.Errorf("counter over two generations: %d, want 12", got)
			}
		})
	}
}

// TestTruncationRestoredWithoutWatcher: with no watcher (inotify missing),
// Check, which the stats flush calls, restores the file, and a fault met by
// an operation of the Region is an error followed by a restore, never a
// crash.
func TestTruncationRestoredWithoutWatcher(t *testing.T) {
	o := smallOptions(t)
	o.Path = shmPath(t)
	r := openRegion(t, o)
	r.stopWatch()
	c, _ := r.Alloc("c", KindCounter, 0)
	if err := os.Truncate(o.Path, 0); err != nil {
		t.Fatal(err)
	}
	// Alloc faults, restores and tries again.
	d, err := r.Alloc("d", KindCounter, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Truncations() != 1 {
		t.Fatalf("truncations %d, want 1", r.Truncations())
	}
	atomic.AddUint64(lane(t, r, c, 0), 1)
	atomic.AddUint64(lane(t, r, d, 0), 1)
	if err := os.Truncate(o.Path, int64(r.g.recordsOff)); err != nil {
		t.Fatal(err)
	}
	r.Heartbeat() // faults on nothing: the owner table is still there
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if r.Truncations() != 2 {
		t.Fatalf("truncations %d, want 2", r.Truncations())
	}
	s, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Stats) != 2 || statOf(t, s, "d").Counter != 0 {
		t.Fatalf("after the second truncation: %+v", s.Stats)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRefuseWritableRegion: a region file that group or others may write
// is refused at attach, whatever its contents, with the path and what to
// do; so is a mode in the options that would create one.
func TestRefuseWritableRegion(t *testing.T) {
	o := smallOptions(t)
	r := openRegion(t, o)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o666, 0o660, 0o646, 0o620} {
		if err := os.Chmod(o.Path, mode); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(o.Path)
		_, err := Open(o)
		if err == nil || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), "writable by group or others") ||
			!strings.Contains(err.Error(), "chmod 0640 "+o.Path) {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		if after, _ := os.ReadFile(o.Path); string(after) != string(before) {
			t.Fatalf("mode %#o: a refused file was modified", mode)
		}
	}
	// An empty world-writable file (someone else may hold it open for
	// writing) is refused too, not adopted.
	empty := filepath.Join(t.TempDir(), "empty.stats")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(empty, 0o666)
	oe := o
	oe.Path = empty
	if _, err := Open(oe); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("empty 0666 file: %v", err)
	}
	oe.Path = filepath.Join(t.TempDir(), "new.stats")
	oe.Mode = 0o664
	if _, err := Open(oe); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("Options.Mode 0664: %v", err)
	}
	if _, err := os.Stat(oe.Path); !os.IsNotExist(err) {
		t.Fatalf("a file was created with a refused mode: %v", err)
	}
	os.Chmod(o.Path, 0o640)
	openRegion(t, o)
}

// TestOpenWaitsForRestore: a next generation that meets the region while it
// is truncated under a live one waits for the live one to restore it rather
// than create a new region over it, then attaches to the restored region.
func TestOpenWaitsForRestore(t *testing.T) {
	o := smallOptions(t)
	o.Path = shmPath(t)
	r := openRegion(t, o)
	r.stopWatch() // so that the restore happens when the test says
	c, _ := r.Alloc("c", KindCounter, 0)
	if err := os.Truncate(o.Path, 0); err != nil {
		t.Fatal(err)
	}
	o2 := o
	o2.Epoch = 1
	// One attempt of Open: it must refuse to create over the region.
	want, err := computeGeometry(uint64(o2.MaxOwners), uint64(o2.MaxLanes), uint64(o2.MaxRecords), uint64(o2.StringBytes), uint64(o2.ValueBytes))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(o2.withDefaults(), want); !errors.Is(err, errBeingRestored) {
		t.Fatalf("attach to a region truncated under a live generation: %v, want errBeingRestored", err)
	}
	if fi, err := os.Stat(o.Path); err != nil || fi.Size() != 0 {
		t.Fatalf("file touched while truncated under a live generation: %v %v", fi.Size(), err)
	}
	// Open waits (polling) until the live generation restores it.
	type result struct {
		r   *Region
		err error
	}
	done := make(chan result, 1)
	go func() {
		r2, err := Open(o2)
		done <- result{r2, err}
	}()
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.r.Close()
	c2, err := res.r.Alloc("c", KindCounter, 0)
	if err != nil || c2 != c {
		t.Fatalf("next generation: record %d, %v; want %d", c2, err, c)
	}
}

// TestRestoreConflictReportedOnce: when another generation restored the
// region without a record we have and allocated its index to another stat,
// our check reports the conflict once (not at every flush), and our owner
// entry is back all the same.
func TestRestoreConflictReportedOnce(t *testing.T) {
	o := smallOptions(t)
	o.Path = shmPath(t)
	a := openRegion(t, o)
	a.stopWatch()
	ob := o
	ob.Epoch = 1
	b := openRegion(t, ob)
	b.stopWatch()
	a.Alloc("a0", KindCounter, 0)
	if err := b.Check(); err != nil { // b indexes a0
		t.Fatal(err)
	}
	a.Alloc("a1", KindCounter, 0) // b does not know it yet
	if err := os.Truncate(o.Path, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(); err != nil { // b restores: header, a0, its owner
		t.Fatal(err)
	}
	if id, err := b.Alloc("x", KindGauge, GaugeSum); err != nil || id != 1 {
		t.Fatalf("b.Alloc: %d, %v", id, err)
	}
	err := a.Check()
	if err == nil || !strings.Contains(err.Error(), `record 1 is now gauge "x"`) || !strings.Contains(err.Error(), o.Path) {
		t.Fatalf("first check after the conflict: %v", err)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("second check reports again: %v", err)
	}
	s, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Owners) != 2 {
		t.Fatalf("owners after the restore: %+v", s.Owners)
	}
}
