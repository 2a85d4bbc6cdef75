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
