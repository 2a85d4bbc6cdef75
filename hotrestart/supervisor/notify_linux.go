package supervisor

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// notifier speaks the systemd notify protocol: one datagram of
// newline-separated KEY=VALUE assignments to the socket named by
// $NOTIFY_SOCKET (a path, or "@name" in the abstract namespace).
type notifier struct {
	addr string // "" = no systemd
}

// send sends one datagram made of lines. It is a no-op without a socket.
func (n *notifier) send(lines ...string) error {
	if n.addr == "" {
		return nil
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("notify socket %s: %w", n.addr, err)
	}
	defer unix.Close(fd)
	msg := strings.Join(lines, "\n")
	// x/sys turns a leading '@' into the abstract namespace's NUL.
	if err := unix.Sendto(fd, []byte(msg), 0, &unix.SockaddrUnix{Name: n.addr}); err != nil {
		return fmt.Errorf("notify socket %s: %w", n.addr, err)
	}
	return nil
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, as RELOADING=1 wants
// it in MONOTONIC_USEC=.
func monotonicUsec() string {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return "0"
	}
	return strconv.FormatInt(ts.Nano()/1000, 10)
}
