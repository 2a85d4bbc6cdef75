package hotrestart

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// NewLinkPair makes the socket pair of a generation's link to its
// supervisor (keeper.go): the supervisor's end as a connection, and the
// generation's end as a file for the child to inherit (both close on
// exec: the fork-exec that places the child's end at its descriptor
// number clears the flag on that copy alone).
func NewLinkPair() (supervisorEnd *net.UnixConn, generationEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("supervisor link: socketpair: %w", err)
	}
	sf := os.NewFile(uintptr(fds[0]), "supervisor-link")
	defer sf.Close()
	nc, err := net.FileConn(sf)
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("supervisor link: %w", err)
	}
	return nc.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "generation-link"), nil
}
