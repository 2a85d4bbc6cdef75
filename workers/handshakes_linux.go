package workers

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// handshakesPending reports whether any connection to port is still
// between its SYN and its place in a listening socket's queue: a request
// socket, which a TCP_DEFER_ACCEPT socket also keeps until the client's
// first bytes arrive. A socket that closes for good resets those, so a
// drain keeps it open while there are any (acceptor.awaitHandshakes),
// looking again every handshakePoll.
//
// It asks the kernel (sockDiagRequestSocket): one NETLINK_SOCK_DIAG dump
// per address family, filtered in the kernel to the request sockets of
// port. The kernel still walks its whole table of connections for each,
// but formats and sends only the matches: a tenth of the CPU of reading
// /proc/net/tcp, which formats every TCP socket of the namespace as text
// for us to parse (BenchmarkHandshakesPending with 139k sockets: 20–43 ms
// a look against 250–330 ms; ~100 ms with 50k). That read stays only as
// the fallback, per family, where the netlink query fails (a kernel
// without the inet_diag or tcp_diag module, or without IPv6; a seccomp
// profile that refuses netlink sockets); log hears of the first failure,
// at Debug, once per process. A table neither way can read counts as
// "none" (the drain then closes as it did before it looked).
func handshakesPending(port int, log hclog.Logger) bool {
	for _, t := range tcpTables {
		pending, err := sockDiagLook(t.family, port)
		if err != nil {
			if !sockDiagFailed.Swap(true) {
				log.Debug("asking the kernel for handshakes under way failed; reading "+t.procFile+" instead, which costs CPU in proportion to the namespace's TCP sockets", "family", t.name, "error", err)
			}
			pending = procRequestSocket(t.procFile, port)
		}
		if pending {
			return true
		}
	}
	return false
}

// tcpTables are the address families a request socket can be of, and the
// /proc file each one's sockets are listed in. (A dual-stack socket's
// IPv4 connections are AF_INET request sockets, listed in the IPv4 table.)
var tcpTables = [...]struct {
	name     string
	family   uint8
	procFile string
}{
	{"ipv4", unix.AF_INET, "/proc/self/net/tcp"},
	{"ipv6", unix.AF_INET6, "/proc/self/net/tcp6"},
}

// sockDiagLook is the netlink look, a variable so that a test can make it
// fail and see the fallback taken.
var sockDiagLook = sockDiagRequestSocket

// sockDiagFailed: a netlink look has failed in this process, and the
// fallback was logged.
var sockDiagFailed atomic.Bool

// The parts of <linux/inet_diag.h> that x/sys/unix does not have.
const (
	// sizeofInetDiagReqV2 is struct inet_diag_req_v2: family, protocol,
	// ext, pad (1 byte each), states (u32), then the 48-byte
	// inet_diag_sockid (sport, dport big-endian u16s at its start).
	sizeofInetDiagReqV2 = 56
	// sizeofInetDiagMsg is struct inet_diag_msg: family, state, timer,
	// retrans (1 byte each), the inet_diag_sockid, then five u32s.
	sizeofInetDiagMsg   = 72
	inetDiagReqBytecode = 1  // INET_DIAG_REQ_BYTECODE, the filter attribute
	inetDiagBCSEq       = 11 // INET_DIAG_BC_S_EQ: local port == the next op's "no"
	// tcpSynRecv is TCP_SYN_RECV, the state /proc/net/tcp shows request
	// sockets in (03) and that of a full socket whose handshake is not
	// done (a TCP Fast Open child). tcpNewSynRecv, TCP_NEW_SYN_RECV, is
	// the state the kernel keeps request sockets in since 4.4. The
	// kernel adds the second to a dump that asks for the first
	// (tcp_diag_dump); both are asked for to say what is meant.
	tcpSynRecv    = 3
	tcpNewSynRecv = 12
)

const (
	// sockDiagTimeout bounds each send and receive on the netlink socket,
	// so that a stuck one never holds up a drain: past it the look falls
	// back to /proc. The kernel answers a dump at once (the first part is
	// filled while the request is sent).
	sockDiagTimeout = 250 * time.Millisecond
	// sockDiagBufSize is a receive buffer no dump part outgrows: the
	// kernel sizes the first at most a page (NLMSG_GOODSIZE) and the
	// next ones to the largest buffer the socket has been read with, up
	// to 32 KiB. A truncated part is an error all the same (MSG_TRUNC).
	sockDiagBufSize = 8192
	// sockDiagMaxReads bounds the reads of one dump. The filtered dump
	// ends in one or two, and the first request socket found ends it.
	sockDiagMaxReads = 64
	// sockDiagSeq numbers the one request each netlink socket carries.
	sockDiagSeq = 1
)

var sockDiagBufs = sync.Pool{New: func() any { return new([sockDiagBufSize]byte) }}

// sockDiagRequestSocket asks the kernel whether a TCP request socket of
// family has the local port port, any local address: a SOCK_DIAG_BY_FAMILY
// dump (inet_diag_req_v2) of the request-socket states, with the port
// twice so that only matching sockets come back: in the request's id,
// which the kernel's dump loop compares itself (tcp_diag_dump, all
// kernels), and as the bytecode filter (INET_DIAG_REQ_BYTECODE) that
// `ss 'sport = :N'` builds. Either alone filters on 6.18. Each reply is
// checked again here all the same. One netlink socket per call, closed
// before it returns; the first match ends the read.
func sockDiagRequestSocket(family uint8, port int) (bool, error) {
	if port <= 0 || port > 0xffff {
		return false, fmt.Errorf("sock_diag: port %d is not a TCP port", port)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return false, fmt.Errorf("sock_diag: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(sockDiagTimeout.Nanoseconds())
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return false, fmt.Errorf("sock_diag: netlink socket timeout: %w", err)
		}
	}
	req := sockDiagDumpRequest(family, uint16(port))
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("sock_diag: send the dump request: %w", err)
	}
	buf := sockDiagBufs.Get().(*[sockDiagBufSize]byte)
	defer sockDiagBufs.Put(buf)
	for range sockDiagMaxReads {
		n, _, flags, from, err := unix.Recvmsg(fd, buf[:], nil, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				return false, fmt.Errorf("sock_diag: no reply from the kernel within %v: %w", sockDiagTimeout, err)
			}
			return false, fmt.Errorf("sock_diag: read the dump: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return false, fmt.Errorf("sock_diag: a dump part longer than the %d-byte buffer", sockDiagBufSize)
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue // not from the kernel
		}
		found, done, err := parseSockDiagReply(buf[:n], family, uint16(port))
		if err != nil || found || done {
			return found, err
		}
	}
	return false, fmt.Errorf("sock_diag: the dump did not end within %d reads", sockDiagMaxReads)
}

// sockDiagDumpRequest is the netlink message: header, inet_diag_req_v2,
// and the INET_DIAG_REQ_BYTECODE attribute holding the filter
// "local port == port" (INET_DIAG_BC_S_EQ: on a match go 8 bytes on, to
// the end of the program, which accepts; otherwise 12, past the end,
// which rejects; the op after it holds the port in host order).
func sockDiagDumpRequest(family uint8, port uint16) [unix.NLMSG_HDRLEN + sizeofInetDiagReqV2 + 4 + 8]byte {
	var m [unix.NLMSG_HDRLEN + sizeofInetDiagReqV2 + 4 + 8]byte
	ne := binary.NativeEndian
	ne.PutUint32(m[0:], uint32(len(m)))
	ne.PutUint16(m[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(m[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(m[8:], sockDiagSeq)
	r := m[unix.NLMSG_HDRLEN:]
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 1<<tcpSynRecv|1<<tcpNewSynRecv)
	binary.BigEndian.PutUint16(r[8:], port) // id.idiag_sport
	a := r[sizeofInetDiagReqV2:]
	ne.PutUint16(a[0:], 4+8) // nla_len
	ne.PutUint16(a[2:], inetDiagReqBytecode)
	bc := a[4:]
	bc[0], bc[1] = inetDiagBCSEq, 8
	ne.PutUint16(bc[2:], 12)
	ne.PutUint16(bc[6:], port)
	return m
}

// parseSockDiagReply reads one datagram of a dump: found once a request
// socket of family with the local port port is in it, done at the dump's
// end (NLMSG_DONE), an error for one the kernel ended in error or a
// message that does not fit the datagram.
func parseSockDiagReply(b []byte, family uint8, port uint16) (found, done bool, err error) {
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			return false, false, fmt.Errorf("sock_diag: %d bytes after the last message, short of a header", len(b))
		}
		msgLen := int(ne.Uint32(b[0:]))
		if msgLen < unix.NLMSG_HDRLEN || msgLen > len(b) {
			return false, false, fmt.Errorf("sock_diag: a message of length %d in %d bytes", msgLen, len(b))
		}
		typ, seq, body := ne.Uint16(b[4:]), ne.Uint32(b[8:]), b[unix.NLMSG_HDRLEN:msgLen]
		if seq != sockDiagSeq {
			return false, false, fmt.Errorf("sock_diag: a reply to request %d, not %d", seq, sockDiagSeq)
		}
		switch typ {
		case unix.NLMSG_DONE:
			// Its payload, where there is one, is the dump's outcome.
			if len(body) >= 4 {
				if e := int32(ne.Uint32(body)); e < 0 {
					return false, false, fmt.Errorf("sock_diag: the dump ended in error: %w", syscall.Errno(-e))
				}
			}
			return false, true, nil
		case unix.NLMSG_ERROR:
			if len(body) < 4 {
				return false, false, errors.New("sock_diag: an error message without its error")
			}
			if e := int32(ne.Uint32(body)); e != 0 {
				return false, false, fmt.Errorf("sock_diag: the kernel refused the dump: %w", syscall.Errno(-e))
			}
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(body) < sizeofInetDiagMsg {
				return false, false, fmt.Errorf("sock_diag: a socket message of %d bytes, short of %d", len(body), sizeofInetDiagMsg)
			}
			state := body[1]
			if body[0] == family && (state == tcpSynRecv || state == tcpNewSynRecv) && binary.BigEndian.Uint16(body[4:]) == port {
				return true, false, nil
			}
		}
		next := (msgLen + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if next >= len(b) {
			break
		}
		b = b[next:]
	}
	return false, false, nil
}

// procRequestSocket reports whether the /proc/net/tcp-format file name
// lists a request socket (state 03, TCP_SYN_RECV as the kernel prints
// request sockets) whose local port is port. An unreadable file lists
// none. It reads every line: the fallback for sockDiagRequestSocket only.
func procRequestSocket(name string, port int) bool {
	want := []byte(fmt.Sprintf(":%04X", port)) // as the kernel prints it
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 512), 4096)
	sc.Scan() // the header
	for sc.Scan() {
		// "  sl  local_address rem_address   st ..."
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 4 || !bytes.Equal(fields[3], []byte("03")) {
			continue
		}
		if bytes.HasSuffix(fields[1], want) {
			return true
		}
	}
	return false
}
