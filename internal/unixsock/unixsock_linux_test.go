package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"strings"

	"github.com/hotproxy/hotproxy/internal/safefile"
)

func TestListenPathIsPrivateAndStaleFilesAreReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	// A stale socket file: bound, then its listener gone without unlink.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the stale socket file should still exist: %v", err)
	}

	ln, err := Listen("unix", path)
	if err != nil {
		t.Fatalf("Listen over a stale socket file: %v", err)
	}
	defer ln.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("socket file mode %o, want 600", mode)
	}
	if _, err := Listen("unix", path); !errors.Is(err, ErrInUse) {
		t.Errorf("second Listen on a live path: %v, want ErrInUse", err)
	}
}

func TestListenAbstractInUse(t *testing.T) {
	addr := "@hotproxy-unixsock-test." + t.Name()
	ln, err := Listen("unixpacket", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Listen("unixpacket", addr); !errors.Is(err, ErrInUse) {
		t.Errorf("second Listen on a live abstract address: %v, want ErrInUse", err)
	}
}

func TestAuthorizeLetsThisUserIn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	pid, err := Authorize(sc)
	if err != nil {
		t.Fatalf("Authorize of this process's own connection: %v", err)
	}
	if pid != os.Getpid() {
		t.Errorf("peer pid %d, want %d (this process)", pid, os.Getpid())
	}
}

// TestHolderAndBoundBy: Holder asks the kernel who listens at a name;
// BoundBy finds who holds a name bound without listening, which Holder
// cannot reach.
func TestHolderAndBoundBy(t *testing.T) {
	addr := "@hotproxy-unixsock-test.holder." + strconv.Itoa(os.Getpid())
	ln, err := Listen("unixpacket", addr)
	if err != nil {
		t.Fatal(err)
	}
	uid, pid, err := Holder("unixpacket", addr, time.Second)
	ln.Close()
	if err != nil || uid != os.Geteuid() || pid != os.Getpid() {
		t.Fatalf("Holder = uid %d pid %d, %v; want this process (uid %d pid %d)", uid, pid, err, os.Geteuid(), os.Getpid())
	}

	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	silent := addr + ".silent"
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: silent}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Holder("unixpacket", silent, time.Second); err == nil {
		t.Fatal("Holder of a name bound without listen: no error")
	}
	uid, pid, ok := BoundBy(silent)
	if !ok || uid != os.Geteuid() || pid != os.Getpid() {
		t.Fatalf("BoundBy = uid %d pid %d ok %v; want this process (uid %d pid %d)", uid, pid, ok, os.Geteuid(), os.Getpid())
	}
	if _, _, ok := BoundBy(addr + ".nobody-binds-this"); ok {
		t.Fatal("BoundBy of a free name: found a holder")
	}
}

// TestListenPathNeedsPrivateDir (issue 20, item 8): a path socket (the
// control socket, a hot_restart.socket_dir restart socket) is bound only
// in a directory of ours that nobody else may write; a missing one is
// created 0700; anything else is refused naming the directory, and
// nothing is bound there.
func TestListenPathNeedsPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "hotproxy")
	ln, err := Listen("unixpacket", filepath.Join(dir, "hotproxy.1.0.sock"))
	if err != nil {
		t.Fatalf("in a missing directory: %v", err)
	}
	ln.Close()
	if fi, err := os.Lstat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created %v, %v; want a 0700 directory", fi.Mode(), err)
	}
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shared, "hotproxy.1.0.sock")
	if _, err := Listen("unixpacket", path); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), shared) {
		t.Errorf("in a world-writable directory: %v; want a refusal naming %s", err, shared)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("a socket was bound there anyway: %v", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	foreign := filepath.Join(t.TempDir(), "foreign")
	if err := os.Mkdir(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unixpacket", filepath.Join(foreign, "s.sock")); !errors.Is(err, safefile.ErrUnsafe) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("in a directory of uid 65534: %v; want a refusal naming the owner", err)
	}
}
