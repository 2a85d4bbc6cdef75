package supervisor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// The control protocol: a client connects to the control socket (a
// SOCK_STREAM Unix socket, mode 0600, peers checked by SO_PEERCRED), writes
// one JSON request on one line and reads one JSON response on one line;
// then the connection is closed.
//
//	{"op":"status"}  → {"ok":true,"status":{...}}
//	{"op":"reload"}  → {"ok":true|false,"reload":{...},"error":"..."} (when the new generation serves or failed)
//	{"op":"reload","wait_commit":true} → the same, once it has also served for its commit window (or rolled back)
//	{"op":"reexec"}  → {"ok":true,"status":{...}} from the new image
//
// A request must arrive within ControlReadTimeout and fit in
// maxRequestBytes; anything else is answered with {"ok":false,"error":...}.

// Control operations.
const (
	OpStatus = "status"
	OpReload = "reload"
	OpReexec = "reexec"
)

// Limits of the control protocol.
const (
	ControlReadTimeout  = 5 * time.Second
	ControlWriteTimeout = 5 * time.Second
	maxRequestBytes     = 4 << 10
	maxResponseBytes    = 1 << 20
	// DefaultClientTimeout bounds a client's wait for an answer; a reload
	// answers when the new generation serves or failed.
	DefaultClientTimeout = 2 * time.Minute
)

// Request is one control request.
type Request struct {
	Op string `json:"op"`
	// WaitCommit (reload): answer once the new generation has also served
	// for its commit window, so that a rollback is reported as a failure.
	WaitCommit bool `json:"wait_commit,omitempty"`
}

// Response is one control response.
type Response struct {
	OK     bool          `json:"ok"`
	Error  string        `json:"error,omitempty"`
	Status *Status       `json:"status,omitempty"`
	Reload *ReloadResult `json:"reload,omitempty"`
}

// ErrNoSupervisor wraps a failure to reach the control socket.
var ErrNoSupervisor = errors.New("no supervisor answers")

// ErrForeignSupervisor wraps a control socket the client refuses to talk
// to: in a directory that is not private, or served by another user.
var ErrForeignSupervisor = errors.New("refusing a control socket another user may control")

// checkControlDir refuses a control socket whose directory is not private
// to this user (safefile.CheckPrivateDir): whoever owns or may write it can
// have replaced the socket. One exception, for root: a directory of
// another user in a parent of root's that nobody else may write (/run)
// was made or handed over by root itself (systemd's RuntimeDirectory=
// with User=, the image's install -d -o hotproxy), so root may talk to
// that user's supervisor there; handedTo is that user's uid (-1 when
// none), whom the listener may then run as.
func checkControlDir(path string) (handedTo int, err error) {
	dir := filepath.Dir(path)
	err = safefile.CheckPrivateDir(dir)
	if err == nil {
		return -1, nil
	}
	var ue *safefile.UnsafeError
	if os.Geteuid() == 0 && errors.As(err, &ue) && ue.ForeignOwner > 0 && safefile.CheckPrivateDir(filepath.Dir(dir)) == nil {
		return ue.ForeignOwner, nil
	}
	return -1, fmt.Errorf("control socket %s: %w: directory %w", path, ErrForeignSupervisor, err)
}

// FindControlSocket is where a supervisor of baseID that was started
// without --control-socket listens: the first of ControlSocketCandidates
// where a socket exists. With none, the error names every place looked at.
// A socket found in a directory that is not private (safefile.
// CheckPrivateDir: another user's, or writable by others) is an error
// naming it, never skipped: anyone could have put it there, and a
// supervisor would not have listened past it. One in a directory of
// root's, for a client that is not root, is skipped: root's supervisor,
// which would not answer this user anyway.
func FindControlSocket(baseID int) (string, error) {
	candidates := ControlSocketCandidates(baseID)
	for _, p := range candidates {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_, err := checkControlDir(p)
			if safefile.OwnedByRoot(err) {
				continue // root's (its supervisor's), not a trap: as listenDefaultControl
			}
			if err != nil {
				return "", err
			}
			return p, nil
		}
	}
	return "", fmt.Errorf("%w for base-id %d: no control socket at %s (is `hotproxy supervise --base-id %d` running as this user? else pass its --control-socket PATH)",
		ErrNoSupervisor, baseID, strings.Join(candidates, ", "), baseID)
}

// Call sends one request to the control socket at path and returns the
// response; timeout bounds the whole exchange (0: DefaultClientTimeout).
// A response with OK false is returned with a nil error: the caller says
// what failed.
func Call(path, op string, timeout time.Duration) (*Response, error) {
	return CallRequest(path, Request{Op: op}, timeout)
}

// CallRequest is Call with a whole request. It talks only through a
// private directory (checkControlDir) and only to a listener that runs as
// this user or root (SO_PEERCRED), or, for root, as the user root gave the
// directory to: anything else could be another user's fake supervisor,
// answering what it likes.
func CallRequest(path string, r Request, timeout time.Duration) (*Response, error) {
	op := r.Op
	if timeout <= 0 {
		timeout = DefaultClientTimeout
	}
	handedTo, err := checkControlDir(path)
	if err != nil {
		return nil, err
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w: %w (is `hotproxy supervise` running with this --base-id or --control-socket?)", path, ErrNoSupervisor, err)
	}
	defer c.Close()
	var stranger *unixsock.StrangerError
	_, err = unixsock.Authorize(c.(*net.UnixConn))
	switch {
	case errors.As(err, &stranger) && stranger.UID == handedTo:
		// root, at the supervisor of the user root gave the directory to.
	case errors.As(err, &stranger):
		return nil, fmt.Errorf("control socket %s: %w: the listener (pid %d) runs as uid %d, neither this user (uid %d) nor root: not a supervisor to trust (remove the socket, or run as that user)", path, ErrForeignSupervisor, stranger.PID, stranger.UID, stranger.Self)
	case err != nil:
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	c.SetDeadline(time.Now().Add(timeout))
	req, _ := json.Marshal(r)
	if _, err := c.Write(append(req, '\n')); err != nil {
		return nil, fmt.Errorf("control socket %s: send %s: %w", path, op, err)
	}
	line, err := readLine(bufio.NewReaderSize(c, 4096), maxResponseBytes)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %s: reading the answer: %w", path, op, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, fmt.Errorf("control socket %s: %s: bad answer: %w", path, op, err)
	}
	return &resp, nil
}

// readLine reads one '\n'-terminated line of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("line longer than %d bytes", max)
		}
		if err == nil {
			return line[:len(line)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// parseRequest decodes one request line.
func parseRequest(line []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return req, fmt.Errorf("request is not JSON: %w", err)
	}
	switch req.Op {
	case OpStatus, OpReload, OpReexec:
		return req, nil
	}
	return req, fmt.Errorf("unknown op %q (use %q, %q or %q)", req.Op, OpStatus, OpReload, OpReexec)
}
