package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fullTmpfs mounts a tmpfs of size bytes on a new directory (unmounted at
// cleanup) and fills it with a file, less reserve bytes.
func fullTmpfs(tb testing.TB, size, reserve int) string {
	tb.Helper()
	requireRoot(tb)
	dir := filepath.Join(tb.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(size)); err != nil {
		tb.Skipf("cannot mount a tmpfs (%v): needs CAP_SYS_ADMIN", err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	fill(tb, dir, size-reserve)
	return dir
}

// fill writes a filler file of at most n bytes into dir, stopping early at
// ENOSPC.
func fill(tb testing.TB, dir string, n int) {
	tb.Helper()
	f, err := os.CreateTemp(dir, "filler")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for written := 0; written < n; written += len(page) {
		if _, err := f.Write(page); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			tb.Fatal(err)
		}
	}
}

// wantFull checks that err says the filesystem is full, and its size, not
// that the file was truncated.
func wantFull(tb testing.TB, what string, err error, size int) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("%s: no error on a full tmpfs", what)
	}
	msg := err.Error()
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(msg, "filesystem") || !strings.Contains(msg, "full") ||
		!strings.Contains(msg, fmt.Sprintf("%d bytes", size)) || strings.Contains(msg, "shrank") {
		tb.Errorf("%s: %v\nwant ENOSPC, saying the filesystem (%d bytes) is full, not that the file was truncated", what, err, size)
	}
}

// TestOpenOnFullTmpfsSaysENOSPC (issue 20, item 10): the region's sparse
// file is reserved (ftruncate needs no blocks), then the first write to
// its header needs a page the full tmpfs does not have: a SIGBUS, which
// used to be reported as "the file shrank while in use (truncated)".
func TestOpenOnFullTmpfsSaysENOSPC(t *testing.T) {
	const size = 64 << 10
	o := smallOptions(t)
	o.Path = filepath.Join(fullTmpfs(t, size, 0), "hotproxy.1.stats")
	_, err := Open(o)
	wantFull(t, "Open", err, size)
}

// TestAllocOnFullTmpfsSaysENOSPC: the region was created while there was
// room; the tmpfs filled up since; allocating records touches new pages
// of the sparse file and fails with the same clear error, and the region
// goes on working for what it has.
func TestAllocOnFullTmpfsSaysENOSPC(t *testing.T) {
	const size = 1 << 20
	dir := fullTmpfs(t, size, size)
	o := smallOptions(t)
	o.Path = filepath.Join(dir, "hotproxy.1.stats")
	o.MaxRecords, o.StringBytes, o.ValueBytes = 4096, 256<<10, 4<<20
	r := openRegion(t, o)
	first, err := r.Alloc("first", KindCounter, 0)
	if err != nil {
		t.Fatal(err)
	}
	firstLane := lane(t, r, first, 0)
	fill(t, dir, size)
	var allocErr error
	for i := range 4096 {
		// Long names: each record takes string-table bytes too.
		if _, allocErr = r.Alloc(fmt.Sprintf("%s.%d", strings.Repeat("n", 200), i), KindCounter, 0); allocErr != nil {
			break
		}
	}
	wantFull(t, "Alloc", allocErr, size)
	// What the region has goes on working.
	if id, err := r.Alloc("first", KindCounter, 0); err != nil || id != first {
		t.Errorf("Alloc of an existing stat: %d, %v; want %d", id, err, first)
	}
	atomic.StoreUint64(firstLane, 7) // no fault: its page was allocated
	// The CLI's reader maps read-only; touching a hole of a full tmpfs
	// through a mapping needs a page too. Whatever it meets, it says so
	// in the same words.
	rd := openReader(t, o.Path)
	if s, err := rd.Snapshot(); err != nil {
		wantFull(t, "Reader.Snapshot", err, size)
	} else {
		statOf(t, s, "first")
	}
}

// TestLaneOnFullTmpfsSaysENOSPC: a second generation attaches to a region
// whose tmpfs filled up since the first one created it; its lanes are
// pages of the sparse file nobody touched yet. Lane gives the ENOSPC
// error (the stats package then counts in process memory) instead of a
// word whose every update on the hot path would fault.
func TestLaneOnFullTmpfsSaysENOSPC(t *testing.T) {
	const size = 4 << 20
	dir := fullTmpfs(t, size, size)
	o := smallOptions(t)
	o.Path = filepath.Join(dir, "hotproxy.1.stats")
	o.MaxRecords, o.MaxLanes, o.MaxOwners, o.Lanes = 4096, 64, 4, 64
	first := openRegion(t, o)
	id, err := first.Alloc("c", KindCounter, 0)
	if err != nil {
		t.Fatal(err)
	}
	lane(t, first, id, 0) // the first owner's page: allocated
	fill(t, dir, size)
	o.Epoch = 1
	second, err := Open(o)
	if err != nil {
		t.Fatalf("Open of the second generation: %v (its owner entry shares the header's pages: it should fit)", err)
	}
	t.Cleanup(func() { second.Close() })
	var laneErr error
	for l := 0; l < o.Lanes && laneErr == nil; l++ {
		_, laneErr = second.Lane(id, l)
	}
	wantFull(t, "Lane of the second generation", laneErr, size)
}
