//go:build linux

package workers

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// openFileLimit is the process's open-file limit (the soft RLIMIT_NOFILE;
// the Go runtime has already raised it to the hard limit at start).
func openFileLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	return rl.Cur, nil
}

// acceptAndClose takes one connection queued on ln without waiting and
// closes it, reporting whether there was one. It works on the raw
// descriptor: unlike acceptQueued it needs no second one for a dup, so it
// succeeds with a single free slot.
func acceptAndClose(ln *net.TCPListener) bool {
	raw, err := ln.SyscallConn()
	if err != nil {
		return false
	}
	nfd := -1
	raw.Control(func(fd uintptr) {
		for {
			nfd, _, err = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if err != unix.EINTR && err != unix.ECONNABORTED {
				return
			}
		}
	})
	if nfd < 0 {
		return false
	}
	unix.Close(nfd)
	return true
}
