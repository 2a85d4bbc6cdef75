package supervisor

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/safefile"
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

// TestDefaultControlDirIsPrivate: a directory the supervisor creates for
// its control socket is 0700; one that exists writable by others is refused
// with a message naming it and the mode, and left as it was.
func TestDefaultControlDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv("RUNTIME_DIRECTORY", dir)
	ctl, err := listenDefaultControl(7, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctl.close()
	if fi, err := os.Lstat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created %v, %v; want mode 0700", fi.Mode(), err)
	}
	if err := os.Chmod(dir, 0o775); err != nil {
		t.Fatal(err)
	}
	if _, err := listenDefaultControl(7, hclog.NewNullLogger()); !errors.Is(err, safefile.ErrUnsafe) ||
		!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "0775") {
		t.Errorf("a 0775 dir: %v; want a refusal naming %s and its mode", err, dir)
	}
	if fi, _ := os.Lstat(dir); fi.Mode().Perm() != 0o775 {
		t.Error("the refused directory was changed")
	}
}

// plantFakeSupervisor is issue 20's item 8: nobody pre-creates this
// user's private runtime directory (<TMPDIR>/hotproxy-<uid>) mode 0755
// and puts a fake control socket in it that answers every request with
// a made-up status. It returns the socket's path and a channel that
// receives each request the fake got.
func plantFakeSupervisor(t *testing.T, baseID int) (string, <-chan string) {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	t.Setenv("RUNTIME_DIRECTORY", "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	dir := PrivateRuntimeDir()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hotproxy."+strconv.Itoa(baseID)+".sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			got <- line
			c.Write([]byte(`{"ok":true,"status":{"pid":1,"serving_epoch":42}}` + "\n"))
			c.Close()
		}
	}()
	return path, got
}

// TestClientRefusesForeignControlDir (issue 20, item 8): `hotproxy status`
// finds the fake socket where it looks last, and refuses it naming the
// directory and its owner; the fake never hears a request. The same for
// a path given with --control-socket.
func TestClientRefusesForeignControlDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to plant a directory owned by uid 65534 (nobody)")
	}
	const baseID = 1<<27 + 4242 // nothing in /run/hotproxy has it
	path, got := plantFakeSupervisor(t, baseID)
	_, err := FindControlSocket(baseID)
	if !errors.Is(err, ErrForeignSupervisor) || !strings.Contains(err.Error(), filepath.Dir(path)) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("FindControlSocket: %v; want a refusal naming %s and uid 65534", err, filepath.Dir(path))
	}
	resp, err := Call(path, OpStatus, 5*time.Second)
	if !errors.Is(err, ErrForeignSupervisor) || resp != nil {
		t.Errorf("Call: %+v, %v; want a refusal and no answer", resp, err)
	}
	select {
	case line := <-got:
		t.Errorf("the fake supervisor got a request: %q", line)
	default:
	}
}

// TestSuperviseRefusesForeignControlDir: the supervisor, looking for a
// place for its socket, meets the foreign directory and stops with a
// message naming it and what to do, rather than listening beside the
// fake or further down the list (where the client would never look).
func TestSuperviseRefusesForeignControlDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to plant a directory owned by uid 65534 (nobody)")
	}
	path, _ := plantFakeSupervisor(t, 4242)
	// First in the list, so that root does not take /run/hotproxy.
	t.Setenv("RUNTIME_DIRECTORY", filepath.Dir(path))
	_, err := listenDefaultControl(4242, hclog.NewNullLogger())
	if !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), filepath.Dir(path)) ||
		!strings.Contains(err.Error(), "uid 65534") || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("listenDefaultControl: %v; want a refusal naming %s, its owner and what to do", err, filepath.Dir(path))
	}
	if _, err := listenControl(path, hclog.NewNullLogger()); !errors.Is(err, safefile.ErrUnsafe) {
		t.Errorf("listenControl(%s): %v; want a refusal", path, err)
	}
}

// startFakeSupervisorAs runs the test binary as uid, as a fake supervisor
// listening at path (MaybeRunFakeControl), and waits until it listens.
// shared is a directory uid may enter, for the copy of the binary.
func startFakeSupervisorAs(t *testing.T, uid int, shared, path string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(shared, "fake.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), FakeControlEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("fake supervisor as uid %d: %q, %v", uid, line, err)
	}
}

// sharedTempDir is a directory under the temp dir that other users may
// enter (t.TempDir's parent is 0700), removed at cleanup.
func sharedTempDir(t *testing.T, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "supervisor-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestClientRefusesForeignListener: a socket in a private directory of
// ours whose listener runs as another uid (nobody bound it in its own
// directory; a link to it sits in ours) is refused by SO_PEERCRED, naming
// the uid, before a request is sent.
func TestClientRefusesForeignListener(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a listener as another uid (nobody)")
	}
	shared := sharedTempDir(t, 0o777)
	fake := filepath.Join(shared, "fake.sock")
	startFakeSupervisorAs(t, 65534, shared, fake)
	private := filepath.Join(t.TempDir(), "ctl.sock")
	if err := os.Link(fake, private); err != nil {
		t.Fatal(err)
	}
	resp, err := Call(private, OpStatus, 5*time.Second)
	if !errors.Is(err, ErrForeignSupervisor) || resp != nil || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("Call: %+v, %v; want a refusal naming uid 65534", resp, err)
	}
}

// TestRootTalksToTheUserItGaveTheDirectory: systemd's RuntimeDirectory=
// with User=hotproxy makes /run/hotproxy, in /run (root's, nobody else
// may write), and hands it to that user, whose supervisor listens there.
// Root's `hotproxy reload` talks to it; a listener of any other uid in
// that directory is still refused.
func TestRootTalksToTheUserItGaveTheDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a listener as another uid (nobody)")
	}
	run := sharedTempDir(t, 0o755) // like /run: root's, others may enter
	handed := filepath.Join(run, "hotproxy")
	if err := os.Mkdir(handed, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(handed, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(handed, "hotproxy.0.sock")
	startFakeSupervisorAs(t, 65534, run, path)
	resp, err := Call(path, OpStatus, 5*time.Second)
	if err != nil || !resp.OK || resp.Status == nil || resp.Status.ServingEpoch != 42 {
		t.Fatalf("Call to the supervisor of the user root gave the directory to: %+v, %v; want its answer", resp, err)
	}
	// The same directory given to another uid: nobody's listener there
	// is not that user's supervisor.
	if err := os.Chown(handed, 65533, 65533); err != nil {
		t.Fatal(err)
	}
	if resp, err := Call(path, OpStatus, 5*time.Second); !errors.Is(err, ErrForeignSupervisor) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("Call with the directory given to uid 65533 and the listener nobody: %+v, %v; want a refusal naming uid 65534", resp, err)
	}
}
