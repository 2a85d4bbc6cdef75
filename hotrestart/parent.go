package hotrestart

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// Address is where generation epoch of base-id baseID listens for its
// successor: the abstract socket "@hotproxy.<base-id>.<epoch>", or a file
// in dir when dir is set.
func Address(baseID, epoch int, dir string) string {
	name := fmt.Sprintf("hotproxy.%d.%d", baseID, epoch)
	if dir == "" {
		return "@" + name
	}
	return filepath.Join(dir, name+".sock")
}

// Handler is the serving generation's side of a hand-over. Its methods are
// called from the goroutine that owns the child's connection, one at a time.
type Handler interface {
	// Sockets returns every listening socket to hand over, with a file
	// for each (a dup the parent closes once sent).
	Sockets() ([]Socket, []*os.File, error)
	// Drain is called when the child serves and asks this generation to
	// drain. unused are the sockets handed over that the child did not
	// take (nil from a child that does not say): nobody will accept on
	// them once this generation stops. It must return promptly.
	Drain(child Identity, unused []Socket)
	// ChildLost is called when the child's connection ends after hello:
	// drained says whether Drain had been called. err is nil when the
	// child closed the connection cleanly.
	ChildLost(child Identity, drained bool, err error)
}

// EarlyCommitter is a Handler that can commit a hand-over before its
// commit window ends. Commit is called when the child, after it asked this
// generation to drain, hands over in turn to a newer generation: the newer
// one supersedes it as the generation to return to, so this one's way
// back must close now (two generations must never be able to serve again
// at once). It must return promptly.
type EarlyCommitter interface {
	Commit(child Identity)
}

// ParentOptions configure a Parent. The zero value of each optional field
// is the default.
type ParentOptions struct {
	// Address to listen on (see Address).
	Address string
	// Self is sent to the child in hello.
	Self    Identity
	Handler Handler
	Logger  hclog.Logger
	// Timeout bounds every read and write of the hand-over itself
	// (default DefaultTimeout).
	Timeout time.Duration
	// ReadyTimeout bounds the wait for the child's next request once it
	// has its sockets: it is starting its workers (default
	// DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// Supervisor is the pid of the supervisor this generation runs under
	// (0: none). A supervised generation refuses to hand over to a process
	// that its supervisor did not start and that does not run under a
	// supervisor of its own (FeatureSupervised): the supervisor, its last
	// generation gone, would exit and leave that process unsupervised.
	Supervisor int
}

// Parent listens for the next generation and serves one hand-over at a
// time.
type Parent struct {
	opts ParentOptions
	log  hclog.Logger
	ln   *net.UnixListener

	// refusals warn about the peers turned away, one limiter per kind of
	// refusal: whoever can connect can trigger these at will, so each logs
	// at most one line per interval (with a count of those held back),
	// and a flood of one kind never hides the first of another.
	refusals [numRefusalKinds]ratelog.Limiter
	// acceptFailures warns about failed accepts (EMFILE...), which a
	// flood of connections can cause.
	acceptFailures ratelog.Limiter

	mu sync.Mutex // guards the fields below
	// active is the connection of the child taking over, if any: one
	// child at a time.
	active *net.UnixConn
	conns  map[*net.UnixConn]struct{}
	closed bool

	wg sync.WaitGroup
}

// Listen binds the restart socket. Serve answers on it.
func Listen(opts ParentOptions) (*Parent, error) {
	if opts.Handler == nil {
		return nil, errors.New("hotrestart: no handler")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ln, err := listen(opts.Address)
	if err != nil {
		return nil, err
	}
	p := &Parent{opts: opts, log: log.Named("hotrestart"), ln: ln, conns: map[*net.UnixConn]struct{}{}}
	for i := range p.refusals {
		p.refusals[i].Log = p.log
	}
	p.acceptFailures.Log = p.log
	return p, nil
}

// refusalKind sorts the refusals, each kind with its own log limiter.
type refusalKind int

const (
	refusedStranger     refusalKind = iota // unidentifiable, or another uid
	refusedProtocol                        // no hello, garbage, incompatible version
	refusedBusy                            // another child is taking over
	refusedUnsupervised                    // would leave the service unsupervised
	numRefusalKinds
)

// Addr is the address the parent listens on.
func (p *Parent) Addr() string { return p.opts.Address }

// Refused counts the peers that were turned away.
func (p *Parent) Refused() uint64 {
	var n uint64
	for i := range p.refusals {
		n += p.refusals[i].Total()
	}
	return n
}

// Serve accepts connections until Close; it returns nil after Close.
func (p *Parent) Serve() error {
	for {
		uc, err := p.ln.AcceptUnix()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// EMFILE and friends: keep serving; the next accept may
			// succeed once fds are freed.
			p.acceptFailures.Warn("accept on the restart socket failed", "error", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			uc.Close()
			return nil
		}
		p.conns[uc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.session(uc)
	}
}

// Close stops listening and ends every session, then waits for them.
func (p *Parent) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for uc := range p.conns {
		uc.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// refuse tells the peer why, counts it, warns (rate-limited by kind) and
// lets the caller close.
func (p *Parent) refuse(c *conn, kind refusalKind, why string, logArgs ...any) {
	p.refusals[kind].Warn("refused a peer on the restart socket: "+why, logArgs...)
	c.send(&Message{Type: MsgError, Error: why}, nil)
}

// session runs one connection's hand-over from hello to close. It owns the
// connection; the handler is called from here alone.
func (p *Parent) session(uc *net.UnixConn) {
	defer p.wg.Done()
	c := &conn{uc: uc, timeout: p.opts.Timeout}
	defer func() {
		// Closed first, then forgotten: a session counts as open until
		// its descriptor is gone, so whoever waits for the sessions to
		// end (Close, a leak check) never sees a descriptor outlive it.
		// Close may close uc at the same time; a second Close is harmless.
		c.closeGracefully()
		p.mu.Lock()
		delete(p.conns, uc)
		p.mu.Unlock()
	}()

	pid, err := unixsock.Authorize(uc)
	var stranger *unixsock.StrangerError
	switch {
	case errors.As(err, &stranger):
		p.refuse(c, refusedStranger, fmt.Sprintf("peer runs as uid %d; only uid %d or root may take over this generation", stranger.UID, stranger.Self),
			"peer_pid", pid, "peer_uid", stranger.UID)
		return
	case err != nil:
		p.refuse(c, refusedStranger, err.Error())
		return
	}

	m, files, err := c.recv(p.opts.Timeout)
	CloseFiles(files)
	if err != nil {
		p.refuse(c, refusedProtocol, "expected hello: "+err.Error(), "peer_pid", pid)
		return
	}
	if m.Type != MsgHello {
		p.refuse(c, refusedProtocol, fmt.Sprintf("expected hello first, got %s", m.Type), "peer_pid", pid)
		return
	}
	if err := compatible(m.Version); err != nil {
		p.refuse(c, refusedProtocol, err.Error(), "peer_pid", pid)
		return
	}
	child := *m.Identity
	child.PID = pid // the kernel's word, not the peer's
	if err := p.checkSupervised(child, m.Version); err != nil {
		p.refuse(c, refusedUnsupervised, err.Error(), "peer_pid", pid)
		return
	}
	// Only a peer that spoke a valid hello claims the hand-over, so a
	// probe or a garbage peer never blocks a real child.
	p.mu.Lock()
	busy := p.active != nil
	if !busy {
		p.active = uc
	}
	p.mu.Unlock()
	if busy {
		p.refuse(c, refusedBusy, "another generation is already taking over from this one; retry once it has finished", "peer_pid", pid)
		return
	}
	// The slot is freed before the handler hears of the loss and before the
	// connection closes: whoever learns of either may try again at once.
	release := func() {
		p.mu.Lock()
		if p.active == uc {
			p.active = nil
		}
		p.mu.Unlock()
	}
	defer release()
	lost := func(child Identity, drained bool, err error) {
		release()
		p.opts.Handler.ChildLost(child, drained, err)
	}

	self := p.opts.Self
	self.Features = append(slices.Clone(self.Features), FeatureUnusedSockets)
	committer, canCommit := p.opts.Handler.(EarlyCommitter)
	if canCommit {
		self.Features = append(self.Features, FeatureEarlyCommit)
	}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &self}, nil); err != nil {
		p.log.Warn("hand-over failed", "child_pid", pid, "error", err)
		return
	}
	p.log.Info("next generation connected", "child_pid", pid, "child_epoch", child.Epoch, "child_version", child.BinaryVersion)

	drained := false
	for {
		m, files, err := c.recv(p.opts.ReadyTimeout)
		CloseFiles(files)
		if err != nil {
			var ne net.Error
			if drained && errors.As(err, &ne) && ne.Timeout() {
				// Once drained, the child keeps the connection open for
				// as long as it lives; silence is normal.
				continue
			}
			if errors.Is(err, errPeerClosed) {
				err = nil
			} else {
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
			}
			lost(child, drained, err)
			return
		}
		switch m.Type {
		case MsgGetSockets:
			if err := p.sendSockets(c); err != nil {
				p.log.Warn("sending sockets failed", "child_pid", pid, "error", err)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
		case MsgDrain:
			if !drained {
				drained = true
				p.opts.Handler.Drain(child, m.Unused)
			}
			c.send(&Message{Type: MsgOK}, nil)
		case MsgCommit:
			if !drained || !canCommit {
				err := fmt.Errorf("commit before drain, or to a parent that did not offer %s", FeatureEarlyCommit)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
			committer.Commit(child)
		default:
			err := fmt.Errorf("unexpected %s message after hello", m.Type)
			c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
			lost(child, drained, err)
			return
		}
	}
}

// checkSupervised refuses a child that would leave a supervised service
// unsupervised. A child of this generation's supervisor is let in on the
// kernel's word (its parent pid); a child that says it runs under a
// supervisor of its own (another container's `supervise --take-over`,
// whose pid the kernel may not even show here) is let in on its word: the
// peer already passed the uid check, so the claim guards against a
// mistake, not an attacker. A child of protocol 1.0 cannot say, so one
// the kernel does not show either (an older binary taking over from
// another container) is let in as before. Anything else, typically `serve
// --restart-epoch N` typed into a shell, is refused with what to do.
func (p *Parent) checkSupervised(child Identity, childVersion string) error {
	sup := p.opts.Supervisor
	if sup == 0 {
		return nil
	}
	if child.PID > 0 {
		if ppid, err := parentPID(child.PID); err == nil && ppid == sup {
			return nil
		}
	}
	if slices.Contains(child.Features, FeatureSupervised) {
		return nil
	}
	if child.PID == 0 && childVersion == "1.0" {
		return nil
	}
	peer := "the new process"
	if child.PID > 0 {
		peer = fmt.Sprintf("pid %d", child.PID)
	}
	return fmt.Errorf("this generation runs under a supervisor (pid %d), which did not start %s: "+
		"taking over from it here would leave the service unsupervised (the supervisor exits once its last generation has). "+
		"Reload through the supervisor instead: `hotproxy reload` (with the same --base-id or --control-socket), or `kill -HUP %d`",
		sup, peer, sup)
}

func (p *Parent) sendSockets(c *conn) error {
	sockets, files, err := p.opts.Handler.Sockets()
	defer CloseFiles(files)
	if err != nil {
		return err
	}
	if len(sockets) != len(files) {
		return fmt.Errorf("handler returned %d sockets and %d files", len(sockets), len(files))
	}
	for start := 0; ; start += maxFilesPerMessage {
		end := min(start+maxFilesPerMessage, len(sockets))
		m := &Message{Type: MsgSockets, Sockets: sockets[start:end], More: end < len(sockets)}
		if err := c.send(m, files[start:end]); err != nil {
			return err
		}
		if !m.More {
			return nil
		}
	}
}
