package shm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Planting what another user can plant in /dev/shm, for the tests of
// openRegionFile (shm imports nothing of the project, so these are not
// internal/safefile/safefiletest's).

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root, to plant files owned by uid 65534 (nobody)")
	}
}

// sharedDir is a directory anyone may write, without the sticky bit, where
// fs.protected_symlinks does not apply.
func sharedDir(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	return dir
}

func rootOnlyTarget(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "root-only")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(dir, "victim")
}

// TestOpenRefusesPlantedSymlink (issue 20, item 2): nobody's symbolic link
// at the region's path, to a path only root may write: Open refuses it
// naming the path, and the target is not created (it was: 85 MB of it).
func TestOpenRefusesPlantedSymlink(t *testing.T) {
	requireRoot(t)
	o := smallOptions(t)
	o.Path = filepath.Join(sharedDir(t), "hotproxy.1.stats")
	target := rootOnlyTarget(t)
	if err := os.Symlink(target, o.Path); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(o.Path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := Open(o)
	if err == nil || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), "symbolic link owned by uid 65534") {
		t.Errorf("Open through a symlink: %v; want a refusal naming %s and the link's owner", err, o.Path)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the link's target was created (%v)", err)
	}
	// The link itself is left alone: it is not ours to remove.
	if fi, err := os.Lstat(o.Path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v %v", fi, err)
	}
}

// TestOpenRefusesHardLink: a second name (link count 2) for a file of
// root's, empty so that the old code would have made a region of it.
func TestOpenRefusesHardLink(t *testing.T) {
	requireRoot(t)
	o := smallOptions(t)
	o.Path = filepath.Join(sharedDir(t), "hotproxy.1.stats")
	target := rootOnlyTarget(t)
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(target, o.Path); err != nil {
		t.Fatal(err)
	}
	_, err := Open(o)
	if err == nil || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), "2 hard links") {
		t.Errorf("Open on a hard link: %v; want a refusal naming %s and its 2 links", err, o.Path)
	}
	if fi, err := os.Stat(target); err != nil || fi.Size() != 0 {
		t.Errorf("the linked file was written to: %v %v", fi.Size(), err)
	}
}
