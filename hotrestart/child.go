package hotrestart

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// Child is the next generation's end of a hand-over.
type Child struct {
	c      *conn
	parent Identity
}

// ErrNoParent means nothing listens at the parent's address: no
// generation of that epoch is running.
var ErrNoParent = errors.New("no running generation to take over from")

// ExpectedParent is the process a child expects to find listening at the
// restart socket. The zero value expects any process that runs as this
// process's effective uid or as root: all a child can check of a parent
// in a pid namespace it cannot see (another container's, whose pid the
// kernel reports as 0), or of one nobody told it about.
type ExpectedParent struct {
	// PID is the parent's pid; 0 checks the uid only.
	PID int
	// StartTime is the parent's start time (ProcessStartTime); with PID
	// it names one process, even once the pid is reused. 0 with a PID:
	// the pid alone.
	StartTime uint64
}

// ParseExpectedParent reads "PID" or "PID:START_TIME" (see
// ExpectedParent), as --restart-parent gives it.
func ParseExpectedParent(s string) (ExpectedParent, error) {
	pidStr, startStr, hasStart := strings.Cut(s, ":")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return ExpectedParent{}, fmt.Errorf("parent %q: want PID or PID:START_TIME with a pid above 0", s)
	}
	e := ExpectedParent{PID: pid}
	if hasStart {
		if e.StartTime, err = strconv.ParseUint(startStr, 10, 64); err != nil || e.StartTime == 0 {
			return ExpectedParent{}, fmt.Errorf("parent %q: start time %q is not a number of clock ticks above 0 (want PID or PID:START_TIME)", s, startStr)
		}
	}
	return e, nil
}

func (e ExpectedParent) String() string {
	switch {
	case e.PID == 0:
		return "any process of this user or root"
	case e.StartTime == 0:
		return fmt.Sprintf("pid %d", e.PID)
	}
	return fmt.Sprintf("pid %d started at tick %d", e.PID, e.StartTime)
}

// DialOptions configure DialParent. The zero value of each optional field
// is the default.
type DialOptions struct {
	// Addresses are tried in order (Addresses(baseID, epoch, dir)).
	Addresses []string
	// Self is sent to the parent in hello.
	Self Identity
	// Timeout bounds every read and write (default DefaultTimeout).
	Timeout time.Duration
	// Expect is the parent this child will talk to (default: any process
	// of this user or root). Another listener is skipped before a byte is
	// sent to it.
	Expect ExpectedParent
	// Logger warns about the listeners skipped (default: none).
	Logger hclog.Logger
}

// Dial connects to the parent at addr and exchanges hello, checking first
// that the parent runs as this user or root. timeout bounds every read
// and write (DefaultTimeout when 0).
func Dial(addr string, self Identity, timeout time.Duration) (*Child, error) {
	return DialParent(DialOptions{Addresses: []string{addr}, Self: self, Timeout: timeout})
}

// DialParent connects to the first of opts.Addresses whose listener is the
// expected parent, and exchanges hello. The listener's credentials are
// checked before anything is sent: a name anyone may bind is not proof of
// anything. A listener of another user, or not the expected process, is
// skipped with a warning; if none is left, the error wraps ErrNoParent
// and names what was skipped.
func DialParent(opts DialOptions) (*Child, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("hotrestart")
	if len(opts.Addresses) == 0 {
		return nil, errors.New("hotrestart: no restart socket address to dial")
	}
	var skipped []string
	var firstErr error
	for _, addr := range opts.Addresses {
		uc, err := dial(addr, opts.Timeout)
		if err != nil {
			if errors.Is(err, ErrNotSupported) {
				return nil, err
			}
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if why := checkParent(uc, opts.Expect); why != "" {
			// Not a byte to it: not even hello, which names this
			// generation.
			uc.Close()
			log.Warn(fmt.Sprintf("restart socket %s: %s; not taking over from it (it gets nothing, not even a hello). "+
				"Skipped; if nothing else answers, this generation does not take over. "+
				"Find the process (ss -xlp | grep %s) and stop it", addr, why, strings.TrimPrefix(addr, "@")),
				"restart_socket", addr)
			skipped = append(skipped, addr+": "+why)
			continue
		}
		return hello(uc, opts)
	}
	if len(skipped) > 0 {
		return nil, fmt.Errorf("restart socket %s: %w: skipped %s", opts.Addresses[0], ErrNoParent, strings.Join(skipped, "; "))
	}
	return nil, fmt.Errorf("restart socket %s: %w (%v)", opts.Addresses[0], ErrNoParent, firstErr)
}

// checkParent says why the listener at the other end of uc is not the
// expected parent, or "" when it is.
func checkParent(uc *net.UnixConn, want ExpectedParent) string {
	pid, err := unixsock.Authorize(uc)
	var stranger *unixsock.StrangerError
	switch {
	case errors.As(err, &stranger):
		return fmt.Sprintf("held by uid %d (pid %d), another user: only uid %d or root may be the previous generation",
			stranger.UID, stranger.PID, stranger.Self)
	case err != nil:
		return err.Error()
	case want.PID == 0:
		return ""
	case pid == 0:
		return fmt.Sprintf("held by a process in a pid namespace this one cannot see, not by the previous generation (pid %d, as its supervisor says)", want.PID)
	case pid != want.PID:
		return fmt.Sprintf("held by pid %d, not by the previous generation (pid %d, as its supervisor says)", pid, want.PID)
	case want.StartTime == 0:
		return ""
	}
	started, err := ProcessStartTime(pid)
	if err != nil {
		return fmt.Sprintf("held by pid %d, whose start time cannot be read (%v)", pid, err)
	}
	if started != want.StartTime {
		return fmt.Sprintf("held by pid %d started at tick %d, not by the previous generation (started at tick %d): the pid was reused",
			pid, started, want.StartTime)
	}
	return ""
}

// hello exchanges hello on a connection to an authenticated parent.
func hello(uc *net.UnixConn, opts DialOptions) (*Child, error) {
	c := &conn{uc: uc, timeout: opts.Timeout}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &opts.Self}, nil); err != nil {
		uc.Close()
		return nil, err
	}
	m, err := c.expect(MsgHello)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if err := compatible(m.Version); err != nil {
		uc.Close()
		return nil, err
	}
	return &Child{c: c, parent: *m.Identity}, nil
}

// expect reads one message of type want; an error message from the peer
// becomes an error wrapping ErrRefused.
func (c *conn) expect(want MessageType) (*Message, error) {
	m, files, err := c.recv(0)
	if err != nil {
		return nil, err
	}
	if m.Type == MsgError {
		CloseFiles(files)
		return nil, fmt.Errorf("%w: %s", ErrRefused, m.Error)
	}
	if m.Type != want {
		CloseFiles(files)
		return nil, fmt.Errorf("expected %s, got %s", want, m.Type)
	}
	if len(files) > 0 {
		CloseFiles(files)
		return nil, fmt.Errorf("%s message carried unexpected fds", m.Type)
	}
	return m, nil
}

// Parent is what the parent said of itself in hello.
func (ch *Child) Parent() Identity { return ch.parent }

// Sockets asks for every listening socket. The caller owns the files.
func (ch *Child) Sockets() ([]Socket, []*os.File, error) {
	if err := ch.c.send(&Message{Type: MsgGetSockets}, nil); err != nil {
		return nil, nil, err
	}
	return recvSockets(ch.c)
}

// SessionTicketKeys asks the parent for its listeners' TLS session-ticket
// keys. offered is false, and nothing is asked, when the parent does not
// offer FeatureSessionTicketKeys (an older binary): this generation makes
// keys of its own, and clients do one full handshake. Call it after
// Sockets and before Drain, and install the keys before serving.
func (ch *Child) SessionTicketKeys() (keys []ListenerTicketKeys, offered bool, err error) {
	if !slices.Contains(ch.parent.Features, FeatureSessionTicketKeys) {
		return nil, false, nil
	}
	if err := ch.c.send(&Message{Type: MsgGetSessionTicketKeys}, nil); err != nil {
		return nil, true, err
	}
	for {
		m, err := ch.c.expect(MsgSessionTicketKeys)
		if err != nil {
			return nil, true, err
		}
		keys = append(keys, m.TicketKeys...)
		if !m.More {
			return keys, true, nil
		}
	}
}

// XDSResources asks the parent for the dynamic resources it last accepted
// from its control plane. offered is false, and nothing is asked, when the
// parent does not offer FeatureXDSResources (an older binary): this
// generation starts with the file's resources and waits for the control
// plane. nil with offered: the parent holds none. Call it before Sockets.
func (ch *Child) XDSResources() (res *XDSResources, offered bool, err error) {
	if !slices.Contains(ch.parent.Features, FeatureXDSResources) {
		return nil, false, nil
	}
	if err := ch.c.send(&Message{Type: MsgGetXDSResources}, nil); err != nil {
		return nil, true, err
	}
	var all []byte
	for {
		m, err := ch.c.expect(MsgXDSResources)
		if err != nil {
			return nil, true, err
		}
		if len(all)+len(m.Chunk) > MaxXDSResourceBytes {
			return nil, true, fmt.Errorf("xds_resources: more than %d bytes", MaxXDSResourceBytes)
		}
		all = append(all, m.Chunk...)
		if !m.More {
			break
		}
	}
	if len(all) == 0 {
		return nil, true, nil
	}
	res, err = decodeXDSResources(all)
	return res, true, err
}

// Drain tells the parent this generation serves: the parent stops
// accepting and drains. unused are the sockets it handed over that this
// generation did not take; a parent that understands it (an older one
// does not, and is not told) closes them as soon as their queues are
// empty, so that no connection waits in a socket nobody will accept on.
// The connection stays open afterwards, so the parent learns if this
// generation dies.
func (ch *Child) Drain(unused []Socket) error {
	m := &Message{Type: MsgDrain}
	if slices.Contains(ch.parent.Features, FeatureUnusedSockets) {
		m.Unused = unused
	}
	if err := ch.c.send(m, nil); err != nil {
		return err
	}
	_, err := ch.c.expect(MsgOK)
	return err
}

// Commit tells the parent to commit its hand-over now: this generation is
// handing over in turn to a newer one, which supersedes it. A parent that
// does not offer FeatureEarlyCommit is not told (it commits at the end of
// its window). Safe to call while AwaitRelease runs; after the parent has
// let go, it fails harmlessly.
func (ch *Child) Commit() error {
	if !slices.Contains(ch.parent.Features, FeatureEarlyCommit) {
		return nil
	}
	return ch.c.send(&Message{Type: MsgCommit}, nil)
}

// AwaitRelease blocks until the parent closes the connection — it has
// committed the hand-over or exited — and then closes this end, so the
// new generation holds nothing of the old one's. It returns early with an
// error if anything but a close arrives.
func (ch *Child) AwaitRelease() error {
	defer ch.c.uc.Close()
	for {
		m, files, err := ch.c.recv(time.Hour)
		CloseFiles(files)
		var ne interface{ Timeout() bool }
		switch {
		case errors.Is(err, errPeerClosed):
			return nil
		case errors.As(err, &ne) && ne.Timeout():
			continue
		case err != nil:
			return err
		default:
			return fmt.Errorf("unexpected %s message after the hand-over", m.Type)
		}
	}
}

// Close ends the hand-over connection.
func (ch *Child) Close() error { return ch.c.uc.Close() }
