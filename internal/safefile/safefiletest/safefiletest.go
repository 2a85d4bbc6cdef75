// Package safefiletest plants the traps another local user can set in a
// shared directory, for the tests of the code that must not fall in them.
package safefiletest

import (
	"os"
	"path/filepath"
	"testing"
)

// Nobody is the uid (and gid) that owns what is planted.
const Nobody = 65534

// RequireRoot skips tb unless the test runs as root: planting files owned
// by another uid takes root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root, to plant files owned by uid 65534 (nobody)")
	}
}

// SharedDir returns a new directory that anyone may write, without the
// sticky bit: like /tmp where fs.protected_symlinks does not apply, so the
// kernel would follow a link planted there whatever that sysctl says.
func SharedDir(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil { // past the umask
		tb.Fatal(err)
	}
	return dir
}

// PrivateTarget returns a path in a directory only root may enter, where
// a planted link points: the file must never appear there (or grow).
func PrivateTarget(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "root-only")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(dir, "victim")
}

// Symlink plants at link a symbolic link to target owned by nobody.
func Symlink(tb testing.TB, target, link string) {
	tb.Helper()
	if err := os.Symlink(target, link); err != nil {
		tb.Fatal(err)
	}
	if err := os.Lchown(link, Nobody, Nobody); err != nil {
		tb.Fatal(err)
	}
}

// Hardlink plants at link a second name for the existing file target
// (what a user could do to a file of root's where fs.protected_hardlinks
// is 0).
func Hardlink(tb testing.TB, target, link string) {
	tb.Helper()
	if err := os.Link(target, link); err != nil {
		tb.Fatal(err)
	}
}

// Size returns the size of path, -1 when it does not exist.
func Size(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return -1
	}
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Size()
}

// FullTmpfs mounts a tmpfs of size bytes on a new directory (unmounted at
// cleanup) and returns the directory; keep, if not "", is created empty in
// it first. Then a filler file takes every free block, so that the next
// block anything asks for fails with ENOSPC.
func FullTmpfs(tb testing.TB, size int, keep string) string {
	tb.Helper()
	RequireRoot(tb)
	dir := filepath.Join(tb.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := mountTmpfs(dir, size); err != nil {
		tb.Skipf("cannot mount a tmpfs (%v): needs CAP_SYS_ADMIN", err)
	}
	tb.Cleanup(func() {
		if err := unmount(dir); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	if keep != "" {
		if err := os.WriteFile(filepath.Join(dir, keep), nil, 0o640); err != nil {
			tb.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for i := 0; i <= size/len(page); i++ {
		if _, err := f.Write(page); err != nil {
			return dir // full
		}
	}
	tb.Fatalf("tmpfs of %d bytes took %d bytes without filling up", size, size+len(page))
	return ""
}
