package hotrestart

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/ratelog"
)

// Address is where generation epoch of base-id baseID listens for its
// successor: the abstract socket "@hotproxy.<base-id>.<epoch>", or a file
// in dir when dir is set.
func Address(baseID, epoch int, dir string) string {
	return Addresses(baseID, epoch, dir)[0]
}

// MaxAlternates bounds the names a generation tries after Address when
// another user holds it: "@hotproxy.<base-id>.<epoch>.1" to ".7" (or
// "hotproxy.<base-id>.<epoch>.<n>.sock" in dir).
const MaxAlternates = 7

// Addresses lists, in order, the names generation epoch of base-id baseID
// may listen on: Address first, then its MaxAlternates alternates. The
// parent binds the first one that no other user holds; the child tries
// them in the same order and takes the first whose listener
// authenticates. Abstract names have no permissions: whoever binds one
// first holds it, so a fixed name alone would let any local user block
// every hand-over, or pose as the parent.
func Addresses(baseID, epoch int, dir string) []string {
	name := fmt.Sprintf("hotproxy.%d.%d", baseID, epoch)
	addrs := make([]string, 0, 1+MaxAlternates)
	for i := 0; i <= MaxAlternates; i++ {
		n := name
		if i > 0 {
			n += "." + strconv.Itoa(i)
		}
		if dir == "" {
			addrs = append(addrs, "@"+n)
		} else {
			addrs = append(addrs, filepath.Join(dir, n+".sock"))
		}
	}
	return addrs
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

// TicketKeySource is a Handler that hands its listeners' TLS session-ticket
// keys to the child (FeatureSessionTicketKeys), so that a client's ticket
// from this generation resumes on the next. SessionTicketKeys is called
// from the session's goroutine; it must return promptly.
type TicketKeySource interface {
	SessionTicketKeys() []ListenerTicketKeys
}

// XDSResourceSource is a Handler that hands the dynamic resources it last
// accepted from its control plane to the child (FeatureXDSResources).
// XDSResources is called from the session's goroutine; it must return
// promptly. nil: none.
type XDSResourceSource interface {
	XDSResources() *XDSResources
}

// ParentOptions configure a Parent. The zero value of each optional field
// is the default.
type ParentOptions struct {
	// Address to listen on (see Address).
	Address string
	// Alternates are tried in order when another user holds Address
	// (see Addresses); none by default.
	Alternates []string
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
	addr string // the one of Address and Alternates bound

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
	log = log.Named("hotrestart")
	ln, addr, err := listen(append([]string{opts.Address}, opts.Alternates...), log)
	if err != nil {
		return nil, err
	}
	p := &Parent{opts: opts, log: log, ln: ln, addr: addr, conns: map[*net.UnixConn]struct{}{}}
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

// Addr is the address the parent listens on: Address, or the alternate it
// fell back to.
func (p *Parent) Addr() string { return p.addr }

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
