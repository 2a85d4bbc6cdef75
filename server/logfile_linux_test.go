package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

// TestLogFileRefusesPlantedLinks (issue 20, item 2): [log] path in a
// shared directory where nobody planted a symbolic link to a path only
// root may write, or a hard link to a file of root's: OpenLogFile and
// Reopen refuse it naming log.path and the path; the target is neither
// created nor appended to.
func TestLogFileRefusesPlantedLinks(t *testing.T) {
	safefiletest.RequireRoot(t)
	shared := safefiletest.SharedDir(t)
	target := safefiletest.PrivateTarget(t)
	link := filepath.Join(shared, "hotproxy.log")
	safefiletest.Symlink(t, target, link)
	_, err := OpenLogFile(link)
	if !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), `log.path "`+link+`"`) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("OpenLogFile through a symlink: %v; want a refusal naming log.path %s", err, link)
	}
	if n := safefiletest.Size(t, target); n != -1 {
		t.Errorf("the link's target was created (%d bytes)", n)
	}
	if err := os.WriteFile(target, []byte("root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(shared, "hard.log")
	safefiletest.Hardlink(t, target, hard)
	if _, err := OpenLogFile(hard); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), "2 hard links") {
		t.Errorf("OpenLogFile on a hard link: %v; want a refusal", err)
	}

	path := filepath.Join(shared, "rotated.log")
	lf, err := OpenLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	safefiletest.Symlink(t, target, path)
	if err := lf.Reopen(); !errors.Is(err, safefile.ErrUnsafe) {
		t.Errorf("Reopen onto a symlink: %v; want a refusal", err)
	}
	lf.Write([]byte("line\n"))
	if b, _ := os.ReadFile(target); string(b) != "root\n" {
		t.Errorf("target holds %q: appended through a link", b)
	}
}
