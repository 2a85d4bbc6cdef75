package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestControlSocketCandidatesOrder: supervisor and CLI search the same
// places in the same order, systemd's first and the private temp dir last.
func TestControlSocketCandidatesOrder(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("RUNTIME_DIRECTORY", "/run/a:/run/b")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	t.Setenv("TMPDIR", tmp)
	got := ControlSocketCandidates(7)
	want := []string{"/run/a/hotproxy.7.sock", "/run/hotproxy/hotproxy.7.sock", "/run/user/1000/hotproxy.7.sock",
		filepath.Join(tmp, "hotproxy-"+strconv.Itoa(os.Geteuid()), "hotproxy.7.sock")}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("candidates:\n got %q\nwant %q", got, want)
	}
	t.Setenv("RUNTIME_DIRECTORY", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got := ControlSocketCandidates(7); len(got) != 2 || got[0] != "/run/hotproxy/hotproxy.7.sock" {
		t.Errorf("without RUNTIME_DIRECTORY and XDG_RUNTIME_DIR: %q", got)
	}
}

// TestFindControlSocket: the CLI takes the first candidate where a socket
// exists, skips a plain file, and names every place when there is none.
func TestFindControlSocket(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	t.Setenv("RUNTIME_DIRECTORY", first)
	t.Setenv("XDG_RUNTIME_DIR", second)
	t.Setenv("TMPDIR", t.TempDir())
	const baseID = 1<<27 + 12345 // nothing in /run/hotproxy has it
	_, err := FindControlSocket(baseID)
	if !errors.Is(err, ErrNoSupervisor) || !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), second) {
		t.Fatalf("with no socket: %v, want ErrNoSupervisor naming %s and %s", err, first, second)
	}
	// A plain file where a socket would be is not a supervisor.
	if err := os.WriteFile(filepath.Join(first, "hotproxy.134230073.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctl, err := listenControl(filepath.Join(second, "hotproxy.134230073.sock"), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.close()
	got, err := FindControlSocket(baseID)
	if err != nil || got != filepath.Join(second, "hotproxy.134230073.sock") {
		t.Errorf("FindControlSocket = %q, %v; want the socket in %s", got, err, second)
	}
}

// TestPrivateDirRefusesAnotherUsersDir: a directory at the private path
// that is not 0700 is refused, not used: someone else may read it.
func TestPrivateDirRefusesAnotherUsersDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hotproxy-x")
	if err := makePrivateDir(dir); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("fresh dir: %v %v, want 0700", fi.Mode(), err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makePrivateDir(dir); err == nil || !strings.Contains(err.Error(), "0700") {
		t.Errorf("a 0755 dir: %v, want a refusal that says 0700", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := makePrivateDir(dir); err == nil || !strings.Contains(err.Error(), "another user") {
		t.Errorf("a dir of uid 65534: %v, want a refusal that says another user owns it", err)
	}
}
