package safefile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

func TestOpenAppendCreatesAndReopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	for i := range 2 {
		f, err := safefile.OpenAppend(path, 0o640)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		f.WriteString("line\n")
		f.Close()
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "line\nline\n" {
		t.Fatalf("file = %q, %v; want two lines appended", b, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode())
	}
}

// TestOpenAppendRefusesPlantedSymlink: nobody's link in a world-writable
// directory (no sticky bit, so protected_symlinks would not help) to a
// path only root may write: the target is not created, and the error
// names the link and its owner.
func TestOpenAppendRefusesPlantedSymlink(t *testing.T) {
	safefiletest.RequireRoot(t)
	target := safefiletest.PrivateTarget(t)
	link := filepath.Join(safefiletest.SharedDir(t), "x.log")
	safefiletest.Symlink(t, target, link)
	_, err := safefile.OpenAppend(link, 0o640)
	if !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), link) ||
		!strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("err = %v; want a refusal naming %s, a symbolic link and uid 65534", err, link)
	}
	if n := safefiletest.Size(t, target); n != -1 {
		t.Errorf("the link's target was created (%d bytes)", n)
	}
	// An existing target is not appended to either.
	if err := os.WriteFile(target, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := safefile.OpenAppend(link, 0o640); !errors.Is(err, safefile.ErrUnsafe) {
		t.Errorf("link to an existing file: %v, want a refusal", err)
	}
	if n := safefiletest.Size(t, target); n != 7 {
		t.Errorf("target is %d bytes, want 7 (untouched)", n)
	}
}

// TestOpenAppendRefusesHardLinkAndForeignFile: a second name for a file
// (link count 2) and a file another user owns are refused untouched.
func TestOpenAppendRefusesHardLinkAndForeignFile(t *testing.T) {
	safefiletest.RequireRoot(t)
	shared := safefiletest.SharedDir(t)
	target := safefiletest.PrivateTarget(t)
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(shared, "hard.log")
	safefiletest.Hardlink(t, target, link)
	if _, err := safefile.OpenAppend(link, 0o640); !errors.Is(err, safefile.ErrUnsafe) ||
		!strings.Contains(err.Error(), "2 hard links") || !strings.Contains(err.Error(), link) {
		t.Errorf("hard link: %v; want a refusal naming %s and its 2 links", err, link)
	}
	foreign := filepath.Join(shared, "foreign.log")
	if err := os.WriteFile(foreign, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, safefiletest.Nobody, safefiletest.Nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := safefile.OpenAppend(foreign, 0o640); !errors.Is(err, safefile.ErrUnsafe) ||
		!strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("file of uid 65534: %v; want a refusal naming its owner", err)
	}
	if safefiletest.Size(t, target) != 1 || safefiletest.Size(t, foreign) != 0 {
		t.Error("a refused file was written to")
	}
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	// A FIFO: refused by Open (regular files only); for appending, one
	// another user planted is refused at once, never waited on for a
	// reader.
	if err := os.Chown(fifo, safefiletest.Nobody, safefiletest.Nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := safefile.OpenAppend(fifo, 0o640); err == nil || !strings.Contains(err.Error(), fifo) {
		t.Errorf("FIFO of uid 65534 for appending: %v; want an error at once naming it", err)
	}
	if _, err := safefile.Open(fifo, os.O_RDWR, 0); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), "FIFO") {
		t.Errorf("FIFO: %v; want a refusal, not a regular file", err)
	}
}

func TestPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "private")
	if err := safefile.MakePrivateDir(dir); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	if fi, err := os.Lstat(dir); err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Fatalf("created %v %v; want a 0700 directory", fi.Mode(), err)
	}
	if err := safefile.MakePrivateDir(dir); err != nil {
		t.Fatalf("existing private dir: %v", err)
	}
	// Others may look, not write.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := safefile.CheckPrivateDir(dir); err != nil {
		t.Errorf("0755: %v; want it accepted: nobody else may write there", err)
	}
	for _, mode := range []os.FileMode{0o775, 0o757, 0o777 | os.ModeSticky} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%04o", mode.Perm()|map[bool]os.FileMode{true: 0o1000}[mode&os.ModeSticky != 0])
		if err := safefile.CheckPrivateDir(dir); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), want) {
			t.Errorf("mode %s: %v; want a refusal naming the mode %s", mode, err, want)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o777 {
		t.Error("a refused directory was changed")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := safefile.MakePrivateDir(link); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a symlink to a private dir: %v; want a refusal", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Chown(dir, safefiletest.Nobody, safefiletest.Nobody); err != nil {
		t.Fatal(err)
	}
	if err := safefile.MakePrivateDir(dir); !errors.Is(err, safefile.ErrUnsafe) ||
		!strings.Contains(err.Error(), "uid 65534") || !strings.Contains(err.Error(), dir) {
		t.Errorf("a dir of uid 65534: %v; want a refusal naming it and its owner", err)
	}
	if owner, err := safefile.CheckDir(dir); owner != safefiletest.Nobody || err != nil {
		t.Errorf("CheckDir of nobody's dir = %d, %v; want 65534, nil", owner, err)
	}
}
