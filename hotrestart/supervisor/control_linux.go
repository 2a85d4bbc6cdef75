package supervisor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/internal/safefile"
	"github.com/hotproxy/hotproxy/internal/unixsock"
	"github.com/hotproxy/hotproxy/internal/version"
)

// controlServer accepts control connections and hands their requests to
// the loop.
type controlServer struct {
	ln   *net.UnixListener
	path string
	log  hclog.Logger
	once sync.Once

	// refusals and acceptFailures are warnings whoever can connect can
	// trigger at will: each logs at most one line per interval, with a
	// count of those held back. refusals.Total() is in Status.
	refusals       ratelog.Limiter
	acceptFailures ratelog.Limiter
}

func newControlServer(ln *net.UnixListener, path string, log hclog.Logger) *controlServer {
	c := &controlServer{ln: ln, path: path, log: log.Named("control")}
	c.refusals.Log = c.log
	c.acceptFailures.Log = c.log
	return c
}

// refused is the number of control connections turned away.
func (c *controlServer) refused() uint64 { return c.refusals.Total() }

// listenControl binds the control socket at path, mode 0600, in a private
// directory (safefile.MakePrivateDir: ours, not a symbolic link, not
// writable by group or others; created 0700 when missing; anything else
// refused). A stale socket file is replaced; a live
// one (another supervisor) is an error.
func listenControl(path string, log hclog.Logger) (*controlServer, error) {
	if err := safefile.MakePrivateDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("control socket %s: directory: %w (choose another with --control-socket PATH in a directory only this user may write, or \"-\" for none)", path, err)
	}
	ln, err := unixsock.Listen("unix", path)
	if errors.Is(err, unixsock.ErrInUse) {
		return nil, fmt.Errorf("control socket %s: another supervisor is listening there (use another --base-id or --control-socket)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w (choose another with --control-socket PATH, or \"-\" for none)", path, err)
	}
	return newControlServer(ln, path, log), nil
}

// listenDefaultControl binds the control socket in the first of
// ControlSocketCandidates this process may use: a user who is not root
// cannot create /run/hotproxy and falls back to $XDG_RUNTIME_DIR, then to
// a private directory in the temp dir. Each directory must be private
// (ours, not a symbolic link, not writable by group or others; created
// 0700 when missing). Another supervisor already
// listening is an error at once, never a reason to try elsewhere: two
// supervisors of one base-id must not both run. So is a directory that is
// there but not private (another user's, or writable by others): `hotproxy
// status` would find it first and refuse it, so the supervisor must not
// quietly listen further down the list; the error says what to remove.
func listenDefaultControl(baseID int, log hclog.Logger) (*controlServer, error) {
	var tried []error
	for _, path := range ControlSocketCandidates(baseID) {
		dir := filepath.Dir(path)
		err := safefile.MakePrivateDir(dir)
		if errors.Is(err, safefile.ErrUnsafe) && !safefile.OwnedByRoot(err) {
			return nil, fmt.Errorf("control socket %s: directory: %w (or choose a socket with --control-socket PATH, or \"-\" for none)", path, err)
		}
		if err == nil {
			var ln *net.UnixListener
			ln, err = unixsock.Listen("unix", path)
			if errors.Is(err, unixsock.ErrInUse) {
				return nil, fmt.Errorf("control socket %s: another supervisor is listening there (use another --base-id or --control-socket)", path)
			}
			if err == nil {
				return newControlServer(ln, path, log), nil
			}
		}
		tried = append(tried, fmt.Errorf("%s: %w", path, err))
	}
	return nil, fmt.Errorf("control socket: no usable place (choose one with --control-socket PATH, or \"-\" for none): %w", errors.Join(tried...))
}

// controlFromFD rebuilds the control server from a listener inherited
// across a re-execution.
func controlFromFD(fd int, path string, log hclog.Logger) (*controlServer, error) {
	f := os.NewFile(uintptr(fd), "control")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: inherited fd %d: %w", path, fd, err)
	}
	ln, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("control socket %s: inherited fd %d is not a Unix listener", path, fd)
	}
	ln.SetUnlinkOnClose(true)
	return newControlServer(ln, path, log), nil
}

func (c *controlServer) close() { c.once.Do(func() { c.ln.Close() }) }

// serve accepts until the listener is closed.
func (c *controlServer) serve(out chan<- ctlReq, done <-chan struct{}) {
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			c.acceptFailures.Warn("accept on the control socket failed", "error", err)
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		go c.handle(conn, out, done)
	}
}

// handle reads one request, passes it to the loop and writes the answer.
func (c *controlServer) handle(conn *net.UnixConn, out chan<- ctlReq, done <-chan struct{}) {
	handedOver := false
	defer func() {
		if !handedOver {
			conn.Close()
		}
	}()
	_, err := unixsock.Authorize(conn)
	var stranger *unixsock.StrangerError
	switch {
	case errors.As(err, &stranger):
		c.refusals.Warn("refused a control connection from another user", "uid", stranger.UID, "pid", stranger.PID)
		refuse(conn, Response{Error: fmt.Sprintf("uid %d may not control this supervisor (run as uid %d or root)", stranger.UID, stranger.Self)})
		return
	case err != nil:
		c.refusals.Warn("refused a control connection", "error", err)
		return
	}
	conn.SetReadDeadline(time.Now().Add(ControlReadTimeout))
	line, err := readLine(bufio.NewReaderSize(conn, 512), maxRequestBytes)
	if err != nil {
		writeResponse(conn, Response{Error: "bad request: " + err.Error()})
		return
	}
	req, err := parseRequest(line)
	if err != nil {
		writeResponse(conn, Response{Error: "bad request: " + err.Error()})
		return
	}
	r := ctlReq{op: req.Op, waitCommit: req.WaitCommit, reply: make(chan Response, 1)}
	if req.Op == OpReexec {
		// The answer comes from the new image, on this connection.
		f, err := conn.File()
		if err != nil {
			writeResponse(conn, Response{Error: "reexec: " + err.Error()})
			return
		}
		r.conn = f
		conn.Close()
		handedOver = true
	}
	select {
	case out <- r:
	case <-done:
		if r.conn != nil {
			r.conn.Close()
		}
		writeResponse(conn, Response{Error: ErrStopping.Error()})
		return
	}
	if r.conn != nil {
		return
	}
	select {
	case resp := <-r.reply:
		writeResponse(conn, resp)
	case <-done:
		writeResponse(conn, Response{Error: ErrStopping.Error()})
	}
}

// status builds a Status.
func (s *Supervisor) status() *Status {
	st := &Status{
		PID: os.Getpid(), Version: version.Version, Started: s.started, BaseID: s.opts.BaseID,
		Config: s.opts.ConfigPath, Binary: s.binary, Reexecs: s.reexecs, ServingEpoch: -1,
		Reloads: s.reloads, FailedReloads: s.failed, LastFailure: s.lastFailure, Stopping: s.machine.stopping,
		Generations: []GenerationStatus{}, Goroutines: runtime.NumGoroutine(), Waiting: s.machine.waiting(),
	}
	if st.Config == "" {
		st.Config = config.DefaultSource
	}
	if s.ctl != nil {
		st.RefusedControlPeers = s.ctl.refused()
	}
	if s.kept != nil {
		st.KeptSockets = len(s.kept.files)
	}
	now := time.Now()
	for _, g := range s.gens {
		st.Generations = append(st.Generations, GenerationStatus{
			Epoch: g.epoch, PID: g.pid, State: g.state, Started: g.started,
			AgeSeconds: now.Sub(g.started).Round(time.Millisecond).Seconds(), Version: g.version, Binary: g.binary,
		})
		if g.state == StateServing {
			st.ServingEpoch = g.epoch
		}
	}
	return st
}

// onControl answers a control request (reload asynchronously).
func (s *Supervisor) onControl(r ctlReq) {
	switch r.op {
	case OpStatus:
		r.reply <- Response{OK: true, Status: s.status()}
	case OpReload:
		res := make(chan ReloadResult, 1)
		s.requestReload(res, r.waitCommit)
		go func() {
			rr := <-res
			r.reply <- Response{OK: rr.OK, Error: rr.Error, Reload: &rr}
		}()
	case OpReexec:
		if s.reexecReq != nil || s.machine.stopping {
			resp := Response{Error: "reexec: a re-execution is already pending"}
			if s.machine.stopping {
				resp.Error = "reexec: " + ErrStopping.Error()
			}
			if r.conn != nil {
				writeResponse(r.conn, resp)
				r.conn.Close()
			} else {
				r.reply <- resp
			}
			return
		}
		s.reexecReq = &r
	default:
		r.reply <- Response{Error: "unknown op " + strconv.Quote(r.op)}
	}
}

// refuse answers a peer whose request is not read. Closing a Unix stream
// socket with unread data resets the peer, which would then never read
// the answer: so the request is read and dropped (bounded in size and
// time) before the close.
func refuse(conn *net.UnixConn, resp Response) {
	writeResponse(conn, resp)
	conn.CloseWrite()
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(conn, maxRequestBytes))
}

// writeResponse writes resp as one line, bounded by ControlWriteTimeout.
func writeResponse(w interface {
	Write([]byte) (int, error)
	SetWriteDeadline(time.Time) error
}, resp Response) {
	b, _ := json.Marshal(resp)
	w.SetWriteDeadline(time.Now().Add(ControlWriteTimeout))
	w.Write(append(b, '\n'))
}
