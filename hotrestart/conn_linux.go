package hotrestart

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// conn is one end of the restart socket: whole messages with their fds.
type conn struct {
	uc      *net.UnixConn
	timeout time.Duration
}

// send writes m with files attached; files are not closed.
func (c *conn) send(m *Message, files []*os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxMessageBytes {
		return fmt.Errorf("message %s of %d bytes exceeds the %d-byte limit", m.Type, len(b), maxMessageBytes)
	}
	if len(files) > maxFilesPerMessage {
		return fmt.Errorf("message %s carries %d fds, more than %d", m.Type, len(files), maxFilesPerMessage)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			// Not f.Fd(): it puts the descriptor in blocking mode, and
			// that flag belongs to the open file description, which a
			// listening socket's dup shares with the live listener.
			raw, err := f.SyscallConn()
			if err != nil {
				return fmt.Errorf("sending %s: %w", m.Type, err)
			}
			raw.Control(func(fd uintptr) { fds[i] = int(fd) })
		}
		oob = unix.UnixRights(fds...)
	}
	if err := c.uc.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return err
	}
	n, oobn, err := c.uc.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("sending %s: %w", m.Type, err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("sending %s: short write (%d of %d bytes, %d of %d control bytes)", m.Type, n, len(b), oobn, len(oob))
	}
	return nil
}

// recv reads one message within timeout (DefaultTimeout when 0). Received
// fds are returned as files the caller owns; on any error they are closed.
func (c *conn) recv(timeout time.Duration) (*Message, []*os.File, error) {
	if timeout <= 0 {
		timeout = c.timeout
	}
	if err := c.uc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, maxMessageBytes+1)
	oob := make([]byte, unix.CmsgSpace(4*maxFilesPerMessage))
	// Go's ReadMsgUnix sets MSG_CMSG_CLOEXEC on Linux, so received fds
	// never leak into processes we start.
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return nil, nil, errPeerClosed
	}
	if err != nil {
		return nil, nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	fail := func(err error) (*Message, []*os.File, error) {
		CloseFiles(files)
		return nil, nil, err
	}
	switch {
	case ferr != nil:
		return fail(ferr)
	case flags&unix.MSG_CTRUNC != 0:
		return fail(fmt.Errorf("message carried more than %d fds", maxFilesPerMessage))
	case flags&unix.MSG_TRUNC != 0 || n > maxMessageBytes:
		return fail(fmt.Errorf("message larger than %d bytes", maxMessageBytes))
	case n == 0:
		// A zero-length read on SOCK_SEQPACKET is the peer closing.
		return fail(errPeerClosed)
	}
	m, err := decodeMessage(buf[:n])
	if err != nil {
		return fail(err)
	}
	want := 0
	if m.Type == MsgSockets || m.Type == MsgKeepSockets {
		want = len(m.Sockets)
	}
	if len(files) != want {
		return fail(fmt.Errorf("%s message describes %d sockets but carries %d fds", m.Type, want, len(files)))
	}
	return m, files, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var files []*os.File
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			CloseFiles(files)
			return nil, fmt.Errorf("control message: %w", err)
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "hotrestart-socket"))
		}
	}
	return files, nil
}

// closeGracefully ends a connection whose peer may still have messages
// queued to us. Closing a SOCK_SEQPACKET socket with unread data makes the
// kernel reset the peer, which then never reads our last message (the
// reason for a refusal); so shut down our side, read what is queued until
// the peer closes or a short deadline passes, then close.
func (c *conn) closeGracefully() {
	c.uc.CloseWrite()
	c.uc.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*maxFilesPerMessage))
	for i := 0; i < 64; i++ {
		n, oobn, _, _, err := c.uc.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			files, _ := parseRights(oob[:oobn])
			CloseFiles(files)
		}
		if err != nil || (n == 0 && oobn == 0) {
			break
		}
	}
	c.uc.Close()
}

// procStat returns the fields of /proc/<pid>/stat after the command name:
// fields[0] is field 3 (the state) of proc(5). The command name (field 2,
// in parentheses) may hold spaces and parentheses itself, so the fields
// are counted from the last ')'.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, b)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// parentPID reads the parent pid of pid (field 4 of /proc/<pid>/stat).
func parentPID(pid int) (int, error) {
	fields, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(fields) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: no parent pid in %q", pid, fields)
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: parent pid %q: %w", pid, fields[1], err)
	}
	return ppid, nil
}

// ProcessStartTime is when process pid started, in clock ticks after boot
// (field 22 of /proc/<pid>/stat). With the pid it names one process for
// good: a pid is reused, a pid and its start time are not.
func ProcessStartTime(pid int) (uint64, error) {
	fields, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	const startTimeField = 22 - 3 // fields[0] is field 3
	if len(fields) <= startTimeField {
		return 0, fmt.Errorf("/proc/%d/stat: no start time in %q", pid, fields)
	}
	t, err := strconv.ParseUint(fields[startTimeField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: start time %q: %w", pid, fields[startTimeField], err)
	}
	return t, nil
}

// listen binds the first of addrs (Addresses: the restart socket's name,
// then its alternates) that is free or can be taken (see unixsock.Listen:
// a path is mode 0600, a stale one is replaced). A name a generation of
// this user (or root) holds is ErrGenerationRunning: two generations must
// never believe they are the same one. A name another user holds is
// squatted — abstract names have no permissions, anyone may bind one
// first — and is skipped with a warning for the next, so that a squatter
// can neither block this generation nor be mistaken for it.
func listen(addrs []string, log hclog.Logger) (*net.UnixListener, string, error) {
	var squatted []string
	for _, addr := range addrs {
		ln, err := unixsock.Listen("unixpacket", addr)
		if err == nil {
			return ln, addr, nil
		}
		if !errors.Is(err, unixsock.ErrInUse) {
			return nil, "", fmt.Errorf("restart socket %s: %w", addr, err)
		}
		uid, pid, herr := unixsock.Holder("unixpacket", addr, time.Second)
		if herr != nil {
			// Bound but not answering: bound without listen(2), or its
			// backlog kept full. The kernel cannot say who listens, so
			// look for the descriptor. A generation of ours (in the
			// instant between its bind and listen) is found: this
			// process may read its own user's descriptors.
			var found bool
			if uid, pid, found = unixsock.BoundBy(addr); !found {
				log.Warn(fmt.Sprintf("restart socket %s is bound by a process that does not answer and that this one cannot see "+
					"(another user's, or another pid namespace's): not a generation of this service; skipping it for the next name (%v)", addr, herr),
					"restart_socket", addr)
				squatted = append(squatted, addr+" by an unknown process")
				continue
			}
		}
		if self := os.Geteuid(); uid == self || uid == 0 {
			return nil, "", fmt.Errorf("restart socket %s: %w (pid %d)", addr, ErrGenerationRunning, pid)
		}
		log.Warn(fmt.Sprintf("restart socket %s is held by another user (uid %d, pid %d), not by a generation of this service: "+
			"skipping it for the next name; the next generation skips it too. Find out why uid %d binds it (ss -xlp | grep %s)",
			addr, uid, pid, uid, strings.TrimPrefix(addr, "@")),
			"restart_socket", addr, "holder_uid", uid, "holder_pid", pid)
		squatted = append(squatted, fmt.Sprintf("%s by uid %d (pid %d)", addr, uid, pid))
	}
	return nil, "", fmt.Errorf("restart socket: %w: every name this generation may use is held by another user (%s): "+
		"stop those processes, or run this generation with another --base-id", ErrSquatted, strings.Join(squatted, ", "))
}

// dial connects to the restart socket at addr. A path
// (hot_restart.socket_dir) is dialled only in a directory our
// parent could have listened in (unixsock.Listen refuses any other): one
// another user owns or may write holds no parent of ours, only maybe a
// socket that user planted.
func dial(addr string, timeout time.Duration) (*net.UnixConn, error) {
	if !strings.HasPrefix(addr, "@") {
		if err := safefile.CheckPrivateDir(filepath.Dir(addr)); err != nil {
			return nil, fmt.Errorf("socket directory: %w", err)
		}
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unixpacket", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}
