package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// Authorize lets in a peer that runs as this process's effective uid or
// as root and returns its pid. Any other peer is a *StrangerError; a peer
// the kernel cannot identify is another error. It works the same on
// either end: a server checks who connected, a client checks who
// listens (the kernel records the listener's credentials at listen(2)),
// which is what a client of an abstract name must do before it says
// anything, since anyone may bind such a name first.
//
// The pid is 0 for a peer in a pid namespace this process cannot see
// (another container): the uid is all there is to check then.
func Authorize(uc *net.UnixConn) (pid int, err error) {
	uid, pid, err := PeerCred(uc)
	if err != nil {
		return 0, fmt.Errorf("cannot identify the peer: %w", err)
	}
	// SO_PEERCRED records the effective uid, so compare with ours.
	if self := os.Geteuid(); uid != self && uid != 0 {
		return pid, &StrangerError{UID: uid, PID: pid, Self: self}
	}
	return pid, nil
}

// Holder dials the listener at addr and returns its credentials, without
// saying anything to it: who squats a name this process wanted to bind.
func Holder(network, addr string, timeout time.Duration) (uid, pid int, err error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial(network, addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	return PeerCred(c.(*net.UnixConn))
}

// BoundBy finds the process holding a socket bound to addr, from
// /proc/net/unix and the processes' descriptors: for a name that is bound
// but does not answer (bound without listen(2), or a backlog kept full),
// where Holder cannot ask the kernel. ok is false when no process this one
// may inspect holds it (another user's descriptors are readable by root
// only).
func BoundBy(addr string) (uid, pid int, ok bool) {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return 0, 0, false
	}
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) == 8 && f[7] == addr {
			inodes["socket:["+f[6]+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, 0, false
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, false
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := "/proc/" + p.Name() + "/fd"
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(fdDir + "/" + fd.Name())
			if err != nil || !inodes[target] {
				continue
			}
			if uid, err := effectiveUID(pid); err == nil {
				return uid, pid, true
			}
		}
	}
	return 0, 0, false
}

// effectiveUID reads the effective uid of pid ("Uid:" in
// /proc/<pid>/status: real, effective, saved, filesystem), what
// SO_PEERCRED would have said.
func effectiveUID(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) >= 2 {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no Uid line", pid)
}
