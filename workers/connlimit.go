package workers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/ratelog"
)

// The descriptor reserve: what the derived server-wide bound leaves of the
// open-file limit for everything that is not a client connection or its
// upstream — listening sockets, the admin API and its clients, the restart
// socket and the fds a hand-over passes, the stats region, log files,
// health checks. max(64, a tenth of the limit).
const (
	fdReserveMin      = 64
	fdReserveFraction = 10
)

// derivedMaxConnections is the server-wide bound on client connections
// when server.max_connections is 0, for an open-file limit of limit
// descriptors: what is left after the reserve, halved, because a proxied
// connection holds two descriptors (client and upstream; HAProxy sizes
// maxconn from ulimit-n the same way). A limit too small for the reserve
// still allows a quarter of it, so the proxy serves something.
func derivedMaxConnections(limit uint64) int64 {
	const ceiling = 1 << 40 // RLIM_INFINITY and friends: no practical bound
	limit = min(limit, ceiling)
	reserve := max(fdReserveMin, limit/fdReserveFraction)
	n := uint64(0)
	if limit > reserve {
		n = (limit - reserve) / 2
	}
	return int64(max(n, limit/4, 1))
}

// connBudget bounds the open client connections of one generation (one
// process: the descriptors it spends are its own), per listener and for
// all listeners together. Each connection is counted once, in its
// listener's open count: one atomic add when it is accepted, one when it
// closes, no lock. The server-wide bound sums the listeners' counts, a few
// loads, only when it is set.
type connBudget struct {
	// max bounds the sum of open; 0: no bound.
	max int64
	// maxKey says where max comes from, for the refusal warning.
	maxKey string
	// open are the open-connection counts of the listeners, one each
	// (a listener changed in process shares its count with the
	// listener it replaced while that one drains: one bound per name).
	// Replaced whole, copy on write under openMu, when listeners are
	// added (main goroutine) or retired (a retirement's goroutine);
	// accept loads it only where the server-wide bound is set.
	open   atomic.Pointer[[]*paddedCount]
	openMu sync.Mutex

	// spare is a descriptor held in reserve (on /dev/null) for the accept
	// loop that meets EMFILE: closing it frees one slot, enough to take
	// the pending connection off the queue and close it, so the client
	// gets a quick close instead of waiting in a queue nobody can empty,
	// and the loop does not spin on the same error. nil while an accept
	// loop is using it (or if it could not be opened).
	spare atomic.Pointer[os.File]
	// spareOpened: the spare was opened at start, so a missing one means
	// an accept loop ran out of descriptors (see spareMissing).
	spareOpened bool

	// outOfDescriptors and acceptErrors throttle the warnings of accepts
	// that failed for want of descriptors, and for any other reason.
	outOfDescriptors ratelog.Limiter
	acceptErrors     ratelog.Limiter
}

// paddedCount keeps each listener's count on its own cache line: workers
// accepting on different listeners do not slow each other down.
type paddedCount struct {
	n atomic.Int64
	_ [56]byte
}

// newConnBudget sizes the budget: maxConnections (server.max_connections),
// or when 0 the bound derived from the open-file limit. Listeners join it
// with newConnSlots.
func newConnBudget(maxConnections int, log hclog.Logger) *connBudget {
	b := &connBudget{
		outOfDescriptors: ratelog.Limiter{Log: log},
		acceptErrors:     ratelog.Limiter{Log: log},
	}
	b.open.Store(&[]*paddedCount{})
	limit, limitErr := openFileLimit()
	switch {
	case maxConnections > 0:
		b.max = int64(maxConnections)
		b.maxKey = fmt.Sprintf("server.max_connections = %d", b.max)
		if limitErr == nil && b.max > derivedMaxConnections(limit) {
			log.Warn("server.max_connections exceeds what the open-file limit allows; at the limit, accepts and upstream connects fail",
				"max_connections", b.max, "open_file_limit", limit, "fits", derivedMaxConnections(limit),
				"hint", "raise the open-file limit (ulimit -n, systemd LimitNOFILE=) or lower server.max_connections")
		}
	case limitErr != nil:
		log.Warn("no server-wide connection bound: the open-file limit is unknown; set server.max_connections", "error", limitErr)
	default:
		b.max = derivedMaxConnections(limit)
		b.maxKey = fmt.Sprintf("server.max_connections = 0 (derived: %d from the open-file limit %d)", b.max, limit)
		log.Debug("connection bound derived from the open-file limit", "max_connections", b.max, "open_file_limit", limit)
	}
	if f, err := os.Open(os.DevNull); err != nil {
		log.Warn("no spare descriptor: out of file descriptors, accept loops back off instead of closing new connections at once", "error", err)
	} else {
		b.spare.Store(f)
		b.spareOpened = true
	}
	return b
}

// close closes the spare descriptor; accept loops must have stopped.
func (b *connBudget) close() {
	if f := b.spare.Swap(nil); f != nil {
		f.Close()
	}
}

// openTotal is the number of open client connections of all listeners.
func (b *connBudget) openTotal() int64 {
	var n int64
	for _, c := range *b.open.Load() {
		n += c.n.Load()
	}
	return n
}

// join counts c in the budget, unless it is counted already.
func (b *connBudget) join(c *paddedCount) {
	b.openMu.Lock()
	defer b.openMu.Unlock()
	old := *b.open.Load()
	for _, o := range old {
		if o == c {
			return
		}
	}
	b.open.Store(new(append(slices.Clone(old), c)))
}

// leave takes c out of the budget: its listener is retired and its last
// connection closed (a count that is not 0 stays, so that nothing still
// open escapes the bound).
func (b *connBudget) leave(c *paddedCount) bool {
	if c.n.Load() != 0 {
		return false
	}
	b.openMu.Lock()
	defer b.openMu.Unlock()
	old := *b.open.Load()
	b.open.Store(new(slices.DeleteFunc(slices.Clone(old), func(o *paddedCount) bool { return o == c })))
	return true
}

// shedOne takes one connection off ln's queue and closes it, using the
// spare descriptor, after an accept failed for want of descriptors. It
// reports whether it closed one; false (queue empty, spare in use by
// another loop, or the freed slot taken by someone else in between) means
// the caller backs off.
func (b *connBudget) shedOne(ln *net.TCPListener) bool {
	f := b.spare.Swap(nil)
	if f == nil {
		// Another loop is using it, or it was lost: a freed slot was
		// taken before it could be re-opened. Get one back if a slot is
		// free now.
		b.reopenSpare()
		return false
	}
	f.Close()
	shed := acceptAndClose(ln)
	b.reopenSpare()
	return shed
}

// spareMissing reports whether the spare descriptor is out: an accept loop
// ran out of descriptors and is shedding with it, or the slot it freed was
// taken before it could be re-opened. A connection accepted meanwhile most
// likely took that very slot; closing it at once (and re-opening the spare
// in its place) keeps the spare, and so the shedding, alive. One load of
// a pointer that is only written when out of descriptors.
func (b *connBudget) spareMissing() bool {
	return b.spareOpened && b.spare.Load() == nil
}

// reopenSpare opens the spare descriptor unless there is one. Failing (no
// slot free), it stays missing until a later shedOne gets it back.
func (b *connBudget) reopenSpare() {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return
	}
	if !b.spare.CompareAndSwap(nil, f) {
		f.Close() // another loop put one back first
	}
}

// outOfDescriptors reports whether an accept failed for want of file
// descriptors, the process's (EMFILE) or the system's (ENFILE).
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// refusal says which bound refused a connection.
type refusal uint8

const (
	admitted refusal = iota
	overListener
	overServer
)

// connSlots is one listener's share of the budget. Every accepted client
// connection takes a slot before it is served and gives it back with
// release when it closes, exactly once.
type connSlots struct {
	budget *connBudget
	open   *paddedCount // the listener's open connections (one of budget.open)
	max    int64        // the listener's max_connections; 0: no bound
	name   string
	maxKey string // names max for the refusal warning
	// refusals throttles the warning of connections closed over a bound.
	refusals ratelog.Limiter
}

// newConnSlots joins a listener to budget b with its own count, or with
// open, the count of the listener of the same name that it replaces
// (nil: a new one).
func newConnSlots(b *connBudget, open *paddedCount, ls *listenerSnap, log hclog.Logger) *connSlots {
	if open == nil {
		open = new(paddedCount)
	}
	b.join(open)
	return &connSlots{
		budget:   b,
		open:     open,
		max:      int64(ls.maxConnections),
		name:     ls.name,
		maxKey:   fmt.Sprintf("listeners %q max_connections = %d", ls.name, ls.maxConnections),
		refusals: ratelog.Limiter{Log: log},
	}
}

// take counts a new connection and reports whether a bound refuses it; a
// refused one holds no slot. Counting first and checking after makes the
// bound exact: accepts racing at the bound may all be refused where one
// would have fit (each sees the others' counts), never admitted past it.
func (s *connSlots) take() refusal {
	open := &s.open.n
	n := open.Add(1)
	if s.max > 0 && n > s.max {
		open.Add(-1)
		return overListener
	}
	if s.budget.max > 0 && s.budget.openTotal() > s.budget.max {
		open.Add(-1)
		return overServer
	}
	return admitted
}

// release gives back the slot of a connection that took one, when it
// closes. Call it exactly once per admitted connection.
func (s *connSlots) release() { s.open.n.Add(-1) }

// refused closes c, which a bound refused, at once (so the kernel's queue
// does not fill and the client learns now, not after a timeout), counts
// it and warns, at most once per ratelog interval.
func (s *connSlots) refused(c acceptedConn, why refusal, st *listenerStats) {
	c.Close()
	st.cxOverflow.Inc()
	key := s.budget.maxKey
	if why == overListener {
		key = s.maxKey
	}
	s.refusals.Warn("connection limit reached: new connections are closed at once",
		"listener", s.name, "limit", key,
		"hint", "raise the limit (and the open-file limit: ulimit -n, systemd LimitNOFILE=) if the load is legitimate")
}
