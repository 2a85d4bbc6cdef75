package accesslog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

// TestNewRefusesPlantedLinks (issue 20, item 2): an access log in a
// shared directory where nobody planted a symbolic link (to a path only
// root may write) or a hard link (to a file of root's) is refused at New
// and at Reopen; the target is neither created nor appended to, and the
// error names the path.
func TestNewRefusesPlantedLinks(t *testing.T) {
	safefiletest.RequireRoot(t)
	shared := safefiletest.SharedDir(t)
	target := safefiletest.PrivateTarget(t)
	link := filepath.Join(shared, "access.log")
	safefiletest.Symlink(t, target, link)
	_, err := New(Options{Path: link})
	if !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), `access log "`+link+`"`) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("New through a symlink: %v; want a refusal naming %s", err, link)
	}
	if n := safefiletest.Size(t, target); n != -1 {
		t.Errorf("the link's target was created (%d bytes)", n)
	}

	if err := os.WriteFile(target, []byte("root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(shared, "hard.log")
	safefiletest.Hardlink(t, target, hard)
	if _, err := New(Options{Path: hard}); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), "hard links") {
		t.Errorf("New on a hard link: %v; want a refusal", err)
	}

	// Reopen after logrotate: a link planted in the moved file's place
	// is refused and the old file kept.
	path := filepath.Join(shared, "rotated.log")
	l, err := New(Options{Path: path, Format: "%PATH%"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	safefiletest.Symlink(t, target, path)
	if err := <-l.Reopen(); !errors.Is(err, safefile.ErrUnsafe) {
		t.Errorf("Reopen onto a symlink: %v; want a refusal", err)
	}
	l.Enqueue(record(1))
	l.Close()
	if b, _ := os.ReadFile(target); string(b) != "root\n" {
		t.Errorf("target holds %q: appended through a link", b)
	}
	if got := readLines(t, path+".1"); len(got) != 1 || got[0] != "/r/1" {
		t.Errorf("the old file holds %q, want the line", got)
	}
}
