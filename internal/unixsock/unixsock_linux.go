package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/internal/safefile"
)

// Listen binds addr for network ("unix" or "unixpacket"). An address that
// starts with '@' is in the abstract namespace, which has no permissions:
// that is what Authorize is for. A path must be in a private directory
// (safefile.MakePrivateDir: ours, a real directory nobody else may write;
// created 0700 when missing), since whoever owns or may write the
// directory can replace the socket; it is made mode 0600 and removed on
// close; a stale socket file left by a dead process is replaced, one a
// live listener answers on is ErrInUse.
func Listen(network, addr string) (*net.UnixListener, error) {
	ua := &net.UnixAddr{Name: addr, Net: network}
	abstract := len(addr) > 0 && addr[0] == '@'
	if !abstract {
		if err := safefile.MakePrivateDir(filepath.Dir(addr)); err != nil {
			return nil, fmt.Errorf("socket directory: %w", err)
		}
	}
	ln, err := net.ListenUnix(network, ua)
	if err != nil && !abstract && errors.Is(err, unix.EADDRINUSE) {
		d := net.Dialer{Timeout: time.Second}
		if c, derr := d.Dial(network, addr); derr == nil {
			c.Close()
			return nil, ErrInUse
		}
		os.Remove(addr)
		ln, err = net.ListenUnix(network, ua)
	}
	if err != nil && errors.Is(err, unix.EADDRINUSE) {
		return nil, ErrInUse
	}
	if err != nil {
		return nil, err
	}
	if !abstract {
		if err := os.Chmod(addr, 0o600); err != nil {
			ln.Close()
			return nil, err
		}
		ln.SetUnlinkOnClose(true)
	}
	return ln, nil
}

// PeerCred returns the uid and pid of the process at the other end of a
// Unix socket, as the kernel recorded them when it connected.
func PeerCred(uc *net.UnixConn) (uid, pid int, err error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if serr != nil {
		return 0, 0, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return int(cred.Uid), int(cred.Pid), nil
}

// Authorize lets in a peer that runs as this process's uid or as root and
// returns its pid. Any other peer is a *StrangerError; a peer the kernel
// cannot identify is another error.
func Authorize(uc *net.UnixConn) (pid int, err error) {
	uid, pid, err := PeerCred(uc)
	if err != nil {
		return 0, fmt.Errorf("cannot identify the peer: %w", err)
	}
	if self := os.Getuid(); uid != self && uid != 0 {
		return pid, &StrangerError{UID: uid, PID: pid, Self: self}
	}
	return pid, nil
}
