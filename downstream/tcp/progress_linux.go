package tcp

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpProgress is how many bytes the kernel has received on c and seen
// acknowledged: it moves whenever the connection does, even while a
// splice(2) loop holds both ends and nothing in user space counts.
func tcpProgress(c *net.TCPConn) (uint64, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
		return 0, false
	}
	return info.Bytes_received + info.Bytes_acked, true
}
