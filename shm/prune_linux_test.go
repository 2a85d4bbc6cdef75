package shm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPrune: a region a live generation holds is kept; one whose
// generations all closed, or died (owner lock released by the kernel,
// owner entry still "live"), is removed; a file that is not a region is
// left alone.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "hotproxy.1.stats")
	closed := filepath.Join(dir, "hotproxy.2.stats")
	crashed := filepath.Join(dir, "hotproxy.3.stats")
	foreign := filepath.Join(dir, "hotproxy.4.stats")
	other := filepath.Join(dir, "notes.txt")

	l, err := Open(Options{Path: live})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := Open(Options{Path: closed})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	k, err := Open(Options{Path: crashed})
	if err != nil {
		t.Fatal(err)
	}
	k.abandon() // dies without folding: its owner entry still says live
	for _, p := range []string{foreign, other} {
		if err := os.WriteFile(p, []byte("not a region, someone's notes\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	regions, err := DefaultRegions(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{live, closed, crashed, foreign}; strings.Join(regions, ",") != strings.Join(want, ",") {
		t.Fatalf("DefaultRegions = %v, want %v", regions, want)
	}
	for _, tc := range []struct {
		path    string
		removed bool
		reason  string
	}{
		{live, false, "owner slot 0"},
		{closed, true, "unused"},
		{crashed, true, "unused"},
		{foreign, false, "not a hotproxy stats region"},
	} {
		res, err := Prune(tc.path)
		if err != nil {
			t.Fatalf("Prune(%s): %v", tc.path, err)
		}
		_, statErr := os.Stat(tc.path)
		if res.Removed != tc.removed || !strings.Contains(res.Reason, tc.reason) || (statErr == nil) == tc.removed {
			t.Errorf("Prune(%s) = %+v (stat: %v), want removed=%v and a reason with %q", filepath.Base(tc.path), res, statErr, tc.removed, tc.reason)
		}
	}
	// The live region still works.
	if _, err := l.Snapshot(); err != nil {
		t.Errorf("the live region after prune: %v", err)
	}
}

// TestOpenAfterPruneUsesTheFileAtThePath: a generation that opened the
// file just before a prune removed it (it waits on the allocation lock the
// prune holds) does not attach to the removed file: it opens the path
// again and creates a new region there, which readers find.
func TestOpenAfterPruneUsesTheFileAtThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hotproxy.5.stats")
	old, err := Open(Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	// Hold the allocation lock as Prune does.
	lk, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	if err := ofdLock(lk, allocLockOffset, false); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Fstat(int(lk.Fd()), &before); err != nil {
		t.Fatal(err)
	}
	opened := make(chan *Region, 1)
	failed := make(chan error, 1)
	go func() {
		r, err := Open(Options{Path: path})
		if err != nil {
			failed <- err
			return
		}
		opened <- r
	}()
	// Wait until Open waits on the lock: a second lock request on the
	// file shows in /proc/locks as a blocked one ("->").
	waitFor(t, "Open to wait on the allocation lock", func() bool { return blockedOnLock(t, before.Ino) })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	lk.Close() // releases the lock: Open goes on
	var r *Region
	select {
	case r = <-opened:
	case err := <-failed:
		t.Fatalf("Open after the prune: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Open did not return within 5s")
	}
	defer r.Close()
	// What the new generation counts is in the file at the path.
	if _, err := r.Alloc("after.prune", KindCounter, 0); err != nil {
		t.Fatal(err)
	}
	rd, err := OpenReader(path)
	if err != nil {
		t.Fatalf("no region at the path after Open: %v", err)
	}
	defer rd.Close()
	snap, err := rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, st := range snap.Stats {
		found = found || st.Name == "after.prune"
	}
	if !found || len(snap.Owners) != 1 {
		t.Errorf("the region at the path has stats %v and owners %v: the new generation is not using it", snap.Stats, snap.Owners)
	}
}

// blockedOnLock reports whether /proc/locks shows a blocked OFD lock
// request on inode ino.
func blockedOnLock(t *testing.T, ino uint64) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Skipf("no /proc/locks to see a blocked lock: %v", err)
	}
	suffix := ":" + strconvU(ino) + " "
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "->") && strings.Contains(line, "OFDLCK") && strings.Contains(line, suffix) {
			return true
		}
	}
	return false
}

func strconvU(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// TestLiveOwners: a live generation is listed; one that died (its owner
// entry still says live, its lock is gone) and a missing file are not.
func TestLiveOwners(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hotproxy.6.stats")
	if owners, err := LiveOwners(path); err != nil || owners != nil {
		t.Fatalf("LiveOwners of a missing file = %v, %v", owners, err)
	}
	live, err := Open(Options{Path: path, Epoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	// Opened after the live one, so nobody folds it: the table still
	// says live.
	dead, err := Open(Options{Path: path, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	dead.abandon()
	if snap, err := live.Snapshot(); err != nil || len(snap.Owners) != 2 {
		t.Fatalf("the owner table should still list the dead owner: %+v, %v", snap, err)
	}
	owners, err := LiveOwners(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(owners) != 1 || owners[0].Epoch != 2 || owners[0].PID != os.Getpid() {
		t.Errorf("LiveOwners = %+v, want only epoch 2 of this process", owners)
	}
}
