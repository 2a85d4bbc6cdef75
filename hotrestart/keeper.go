package hotrestart

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// The link between a generation and its supervisor: a SOCK_SEQPACKET
// socket pair the supervisor makes for each generation it starts, whose
// other end the generation inherits (serve --supervisor-fd). It speaks the
// messages of the restart socket. Over it the serving generation sends a
// duplicate of every listening socket it has (MsgKeepSockets), once it
// serves and again whenever its set changes; and a generation started
// after the serving one died or wedged asks for them (MsgGetSockets), so
// that it accepts the connections queued in the very sockets the dead one
// listened on instead of binding new ones, which would reset the queued
// connections and refuse new ones until it binds.
//
// The generation sends its sockets rather than the supervisor asking for
// them, because only the generation knows when its set changes, and a
// supervisor that dialled the restart socket would take the one
// hand-over slot a real successor may need at that moment.
//
// Nobody else can speak on the link: its ends exist only in the
// supervisor and in the one child it was made for. The generation checks
// anyway that the peer is its own supervisor (SO_PEERCRED of a socket
// pair names the process that made it), with the rules of the restart
// socket: the same user or root, and the pid its supervisor says.

// SupervisorLink is a generation's end of its link to the supervisor.
type SupervisorLink struct {
	c          *conn
	supervisor Identity
}

// OpenSupervisorLink takes over f, the generation's inherited end of the
// link, checks that the peer is supervisorPID (SupervisorFromEnv: the
// process that started this one) running as this user or root, and
// exchanges hello. f is closed in every case.
func OpenSupervisorLink(f *os.File, supervisorPID int, self Identity, timeout time.Duration) (*SupervisorLink, error) {
	defer f.Close()
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if supervisorPID <= 0 {
		return nil, errors.New("supervisor link: this process runs under no supervisor (HOTPROXY_SUPERVISOR_PID is not its parent): " +
			"--supervisor-fd is for the supervisor to set")
	}
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("supervisor link: fd %d is not a socket: %w", f.Fd(), err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok || uc.LocalAddr().Network() != "unixpacket" {
		nc.Close()
		return nil, fmt.Errorf("supervisor link: fd %d is a %s socket, not a unixpacket one", f.Fd(), nc.LocalAddr().Network())
	}
	pid, err := unixsock.Authorize(uc)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("supervisor link: %w", err)
	}
	if pid != supervisorPID {
		uc.Close()
		return nil, fmt.Errorf("supervisor link: the peer is pid %d, not this generation's supervisor (pid %d): refusing it", pid, supervisorPID)
	}
	c := &conn{uc: uc, timeout: timeout}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &self}, nil); err != nil {
		uc.Close()
		return nil, fmt.Errorf("supervisor link: %w", err)
	}
	m, err := c.expect(MsgHello)
	if err == nil {
		err = compatible(m.Version)
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("supervisor link: %w", err)
	}
	return &SupervisorLink{c: c, supervisor: *m.Identity}, nil
}

// KeepsSockets reports whether the supervisor keeps listening sockets
// (FeatureKeptSockets).
func (l *SupervisorLink) KeepsSockets() bool {
	return slices.Contains(l.supervisor.Features, FeatureKeptSockets)
}

// Keep sends the supervisor a duplicate of every listening socket this
// generation has; they replace what it kept before. Nothing is sent to a
// supervisor that does not keep sockets. The files are not closed.
func (l *SupervisorLink) Keep(sockets []Socket, files []*os.File) error {
	if !l.KeepsSockets() {
		return nil
	}
	if len(sockets) != len(files) {
		return fmt.Errorf("keeping sockets: %d sockets and %d files", len(sockets), len(files))
	}
	return sendBatches(l.c, MsgKeepSockets, sockets, files)
}

// KeptSockets asks the supervisor for the sockets it kept of the
// generation this one replaces. The caller owns the files.
func (l *SupervisorLink) KeptSockets() ([]Socket, []*os.File, error) {
	if !l.KeepsSockets() {
		return nil, nil, fmt.Errorf("supervisor link: the supervisor (pid %d) keeps no sockets (it does not offer %s)", l.supervisor.PID, FeatureKeptSockets)
	}
	if err := l.c.send(&Message{Type: MsgGetSockets}, nil); err != nil {
		return nil, nil, fmt.Errorf("supervisor link: %w", err)
	}
	return recvSockets(l.c)
}

// Close ends the link.
func (l *SupervisorLink) Close() error { return l.c.uc.Close() }

// GenerationLink is the supervisor's end of one generation's link.
type GenerationLink struct {
	c   *conn
	gen Identity
}

// LinkRequest is what a generation asked of its supervisor: to keep its
// sockets (Keep, with Sockets and their Files, which the receiver owns),
// or for the sockets kept (GetSockets).
type LinkRequest struct {
	Keep       bool
	Sockets    []Socket
	Files      []*os.File
	GetSockets bool
}

// AcceptGenerationLink waits (within timeout) for the hello of the
// generation at the other end of uc, the supervisor's end of the pair it
// made for it, and answers with self. keeps says whether this supervisor
// keeps sockets (FeatureKeptSockets).
func AcceptGenerationLink(uc *net.UnixConn, self Identity, keeps bool, timeout time.Duration) (*GenerationLink, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c := &conn{uc: uc, timeout: DefaultTimeout}
	m, files, err := c.recv(timeout)
	CloseFiles(files)
	if err != nil {
		return nil, fmt.Errorf("generation link: expected hello: %w", err)
	}
	if m.Type != MsgHello {
		c.send(&Message{Type: MsgError, Error: "expected hello first"}, nil)
		return nil, fmt.Errorf("generation link: expected hello first, got %s", m.Type)
	}
	if err := compatible(m.Version); err != nil {
		c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
		return nil, fmt.Errorf("generation link: %w", err)
	}
	if keeps {
		self.Features = append(slices.Clone(self.Features), FeatureKeptSockets)
	}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &self}, nil); err != nil {
		return nil, fmt.Errorf("generation link: %w", err)
	}
	return &GenerationLink{c: c, gen: *m.Identity}, nil
}

// Generation is what the generation said of itself in hello.
func (l *GenerationLink) Generation() Identity { return l.gen }

// Next blocks until the generation's next request; the error wraps
// io.EOF-like errPeerClosed (see IsClosed) when the generation is gone.
// A request this end does not serve is an error: the link is then
// useless, and the caller closes it.
func (l *GenerationLink) Next() (LinkRequest, error) {
	for {
		m, files, err := l.c.recv(time.Hour)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if err != nil {
			return LinkRequest{}, err
		}
		switch m.Type {
		case MsgKeepSockets:
			r := LinkRequest{Keep: true, Sockets: m.Sockets, Files: files}
			for m.More {
				if m, files, err = l.c.recv(0); err != nil {
					CloseFiles(r.Files)
					return LinkRequest{}, err
				}
				if m.Type != MsgKeepSockets {
					CloseFiles(files)
					CloseFiles(r.Files)
					return LinkRequest{}, fmt.Errorf("generation link: a %s message in the middle of keep_sockets batches", m.Type)
				}
				r.Sockets = append(r.Sockets, m.Sockets...)
				r.Files = append(r.Files, files...)
			}
			return r, nil
		case MsgGetSockets:
			return LinkRequest{GetSockets: true}, nil
		default:
			CloseFiles(files)
			err := fmt.Errorf("generation link: unexpected %s message", m.Type)
			l.c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
			return LinkRequest{}, err
		}
	}
}

// SendSockets answers a GetSockets request. The files are not closed.
func (l *GenerationLink) SendSockets(sockets []Socket, files []*os.File) error {
	return sendBatches(l.c, MsgSockets, sockets, files)
}

// Refuse answers a request with an error.
func (l *GenerationLink) Refuse(why string) error {
	return l.c.send(&Message{Type: MsgError, Error: why}, nil)
}

// Close ends the link.
func (l *GenerationLink) Close() error { return l.c.uc.Close() }

// IsClosed reports whether err says the other end closed the link.
func IsClosed(err error) bool { return errors.Is(err, errPeerClosed) }

// sendBatches sends sockets with their files in messages of type t of at
// most maxFilesPerMessage each, the last with More unset (one empty
// message when there are none).
func sendBatches(c *conn, t MessageType, sockets []Socket, files []*os.File) error {
	for start := 0; ; start += maxFilesPerMessage {
		end := min(start+maxFilesPerMessage, len(sockets))
		m := &Message{Type: t, Sockets: sockets[start:end], More: end < len(sockets)}
		if err := c.send(m, files[start:end]); err != nil {
			return err
		}
		if !m.More {
			return nil
		}
	}
}

// recvSockets reads sockets batches until the last; an error message
// becomes an error wrapping ErrRefused.
func recvSockets(c *conn) ([]Socket, []*os.File, error) {
	var sockets []Socket
	var files []*os.File
	for {
		m, fs, err := c.recv(0)
		if err != nil {
			CloseFiles(files)
			return nil, nil, err
		}
		switch m.Type {
		case MsgError:
			CloseFiles(fs)
			CloseFiles(files)
			return nil, nil, fmt.Errorf("%w: %s", ErrRefused, m.Error)
		case MsgSockets:
		default:
			CloseFiles(fs)
			CloseFiles(files)
			return nil, nil, fmt.Errorf("expected sockets, got %s", m.Type)
		}
		sockets = append(sockets, m.Sockets...)
		files = append(files, fs...)
		if !m.More {
			return sockets, files, nil
		}
	}
}
