// Package workers runs the per-core workers: each owns its listener sockets,
// its accept loops, its connections and its upstream pools, and reads the
// configuration only through an immutable snapshot that the main thread
// publishes to it (DESIGN §3).
package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/steering"
)

// Identity is what direct responses may show of the running generation.
type Identity struct {
	Version  string
	Epoch    int
	PID      int
	Hostname string
}

// SocketKey names one listening socket: the listener's address and the
// worker that owns it (Worker is -1 for a socket shared by all workers).
type SocketKey struct {
	Network string // "tcp"
	Address string // as written in config, e.g. "127.0.0.1:8080"
	Worker  int
}

// Options configures a Manager. The zero value of each optional field is
// the default.
type Options struct {
	Config      *config.Config // validated
	Concurrency int            // resolved worker count (>= 1)
	Logger      hclog.Logger   // nil: a null logger
	// Inherited are listening sockets handed over by a previous
	// generation, by key. A socket found here is used instead of binding;
	// the Manager owns the file afterwards. Sockets left unused are
	// returned by Unused for the caller to drain.
	//
	// Every inherited socket of a listener's address is adopted, whatever
	// its Worker: in a SO_REUSEPORT group a socket nobody accepts on
	// still gets its share of connections. Worker k accepts on sockets
	// whose Worker is k modulo the concurrency; a shared one (-1) is
	// accepted on by all. If New fails, it closes every inherited file.
	Inherited map[SocketKey]*os.File
	// Stats is the store the workers count into: worker w writes lane
	// w+1 (build it with Workers >= Concurrency). nil: a store in process
	// memory of the Manager's own (tests).
	Stats *stats.Store
}

// Manager owns all workers of one generation.
type Manager struct {
	log       hclog.Logger
	cfg       *config.Config
	n         int
	listeners []*mlistener
	workers   []*worker
	stats     *stats.Store
	// budget bounds the open client connections (connlimit.go).
	budget *connBudget

	// ctx ends at Close or when a drain is forced; it aborts upstream
	// dials of TCP-proxy connections.
	ctx    context.Context
	cancel context.CancelFunc

	// draining makes every HTTP response carry "Connection: close".
	draining atomic.Bool
	// emptyQueuesUntil: once accepting stops, the accept loops take what
	// is still queued on their sockets until this monotime (0: they do
	// not, the Manager is being closed at once).
	// sockets, so their queues are emptied before they close.
	emptyQueuesUntil atomic.Int64
	// queueEmptying: a drain empties the queues (off only by
	// queueEmptyingEnv).
	queueEmptying bool
	// stopMigrations ends countMigrations (Close); migrationsDone closes
	// once it has counted the last migration.
	stopMigrations chan struct{}
	migrationsDone chan struct{}

	mu       sync.Mutex // guards the fields below
	started  bool
	stopped  bool // accepting stopped (drain or close)
	unused   map[SocketKey]*os.File
	snap     *Snapshot // the published one
	forceErr error     // why the drain was forced

	stopAccept chan struct{} // closed when accepting stops
	force      chan struct{} // closed: close whatever is left now
	acceptWG   sync.WaitGroup
	connWG     sync.WaitGroup // TCP-proxy sessions

	drainOnce sync.Once
	drainDone chan struct{}
	drainErr  error
	closeOnce sync.Once
	closeErr  error
}

// mlistener is one configured listener with its sockets and, for HTTP,
// its connection settings.
type mlistener struct {
	idx      int
	name     string
	addr     string
	protocol string
	sockets  []*socket
	h1       *h1Settings // http
	slots    *connSlots  // the listener's connection bound, shared by its workers

	balance string // config: least_conn, hash, kernel ("" is kernel)
	// steer is the eBPF program that spreads the listener's connections
	// over its workers' sockets and migrates a closing socket's queue;
	// nil: the kernel's flow hash (steerErr says why, when the program
	// was wanted).
	steer           *steering.Group
	steerErr        error
	steerUnloadable bool   // steerErr is the kernel refusing the program itself
	protection      string // what protects a closing socket's queue, as logged
	// accessLogs are the listener's access logs, opened by New and
	// closed by Close, after the last request (accesslog.go).
	accessLogs []*accesslog.Logger
}

// worker is one worker's state. Nothing in it is written by another
// worker.
type worker struct {
	id    int
	view  atomic.Pointer[workerView]
	stats []*listenerStats // index: listener
	conns connSet          // long-lived connections: TCP sessions, upgrades
}

// workerView is one worker's view of a snapshot (RCU: replaced whole by
// Publish, loaded once per connection or request).
type workerView struct {
	snap      *Snapshot
	listeners []*listenerView // index: Manager listener; nil: not in the snapshot
}

type listenerView struct {
	*listenerSnap
	tcp      *upstream.WorkerCluster   // tcp listeners
	clusters []*upstream.WorkerCluster // http: index route; nil for direct responses
}

// New binds (or adopts) every listener socket for every worker and returns
// a Manager that is not yet accepting. A bind failure is an error that
// names the listener, the address and what to do; nothing stays bound.
func New(opts Options, snap *Snapshot) (*Manager, error) {
	inh := make(map[SocketKey]*os.File, len(opts.Inherited))
	for k, f := range opts.Inherited {
		inh[k] = f
	}
	closeInherited := func() {
		for _, f := range inh {
			if f != nil {
				f.Close()
			}
		}
	}
	if snap == nil {
		closeInherited()
		return nil, errors.New("workers: nil snapshot")
	}
	cfg := opts.Config
	if cfg == nil {
		cfg = snap.cfg
	}
	n := opts.Concurrency
	if n < 1 {
		n = snap.Workers()
	}
	if snap.Workers() < n {
		closeInherited()
		return nil, fmt.Errorf("workers: the snapshot has views for %d workers, the manager needs %d (build it with BuildSnapshotN)", snap.Workers(), n)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("workers")
	st := opts.Stats
	if st == nil {
		var err error
		if st, err = stats.New(stats.Options{Workers: n, Logger: log}); err != nil {
			closeInherited()
			return nil, err
		}
	}
	if st.Lanes() < n+1 {
		closeInherited()
		return nil, fmt.Errorf("workers: the stats store has %d lanes, the manager needs %d (1 + %d workers)", st.Lanes(), n+1, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		log:        log,
		cfg:        cfg,
		n:          n,
		stats:      st,
		ctx:        ctx,
		cancel:     cancel,
		stopAccept: make(chan struct{}),
		force:      make(chan struct{}),

		stopMigrations: make(chan struct{}),
		migrationsDone: make(chan struct{}),
		drainDone:      make(chan struct{}),
	}
	for i := range cfg.Listeners {
		l := &cfg.Listeners[i]
		ml := &mlistener{idx: i, name: l.Name, addr: l.Address, protocol: l.Protocol, balance: l.Balance}
		m.listeners = append(m.listeners, ml)
		err := m.openAccessLogs(ml, l, snap.id.Epoch)
		switch {
		case err != nil:
		case l.Protocol == config.ProtocolHTTP || l.Protocol == config.ProtocolTCP:
			startSteering(ml, n, cfg.Server.ReusePortEnabled())
			err = openListener(ml, n, cfg.Server.ReusePortEnabled(), inh)
		default:
			err = fmt.Errorf("listener %q: protocol %q is not one of %q, %q", l.Name, l.Protocol, config.ProtocolHTTP, config.ProtocolTCP)
		}
		if err != nil {
			for _, ml := range m.listeners {
				for _, s := range ml.sockets {
					s.close()
				}
				if ml.steer != nil {
					ml.steer.Close()
				}
				for _, al := range ml.accessLogs {
					al.Close()
				}
			}
			closeInherited()
			cancel()
			return nil, err
		}
	}
	// Only once every listener is open: a generation that fails in New
	// never takes a socket group from the previous generation's program.
	for _, ml := range m.listeners {
		attachSteering(ml, n, len(opts.Inherited) > 0)
	}
	m.unused = inh
	m.queueEmptying = os.Getenv(queueEmptyingEnv) != "off"
	for _, ml := range m.listeners {
		logSteering(log, ml, m.queueEmptying)
	}
	m.budget = newConnBudget(cfg, log)
	for i, ml := range m.listeners {
		ml.slots = newConnSlots(m.budget, i, &cfg.Listeners[i], log)
	}
	m.workers = make([]*worker, n)
	for w := range m.workers {
		wk := &worker{id: w, stats: make([]*listenerStats, len(m.listeners))}
		for i, ml := range m.listeners {
			wk.stats[i] = newListenerStats(st, ml.name, w)
			wk.stats[i].steerActive = activeCount(ml, w)
		}
		m.workers[w] = wk
	}
	for i, ml := range m.listeners {
		if ml.protocol == config.ProtocolHTTP {
			ml.h1 = newH1Settings(&cfg.Listeners[i])
		}
	}
	m.Publish(snap)
	if log.IsDebug() {
		for _, ml := range m.listeners {
			log.Debug("listener ready", "listener", ml.name, "address", ml.addr, "protocol", ml.protocol, "sockets", len(ml.sockets))
		}
	}
	return m, nil
}

// Addr returns the local address of the named listener's first socket
// (useful when the config says port 0), or nil.
func (m *Manager) Addr(listener string) net.Addr {
	for _, ml := range m.listeners {
		if ml.name == listener && len(ml.sockets) > 0 {
			return ml.sockets[0].ln.Addr()
		}
	}
	return nil
}

// Workers is the number of workers.
func (m *Manager) Workers() int { return m.n }

// Start starts every worker's accept loops. It does nothing after Drain
// or Close, or when called again.
func (m *Manager) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.stopped {
		return
	}
	m.started = true
	go func() {
		defer close(m.migrationsDone)
		m.countMigrations(m.stopMigrations)
	}()
	for _, ml := range m.listeners {
		for _, s := range ml.sockets {
			for w, wk := range m.workers {
				if s.owner >= 0 && s.owner%m.n != w {
					continue
				}
				a := &acceptor{m: m, s: s, wk: wk, li: ml.idx, st: wk.stats[ml.idx], slots: ml.slots}
				s.acceptors.Add(1)
				m.acceptWG.Add(1)
				if ml.protocol == config.ProtocolHTTP {
					go m.acceptHTTP(a)
				} else {
					go m.acceptTCP(a, ml.idx)
				}
			}
		}
	}
}

// Publish hands a new snapshot to every worker (RCU): new connections and
// requests use it, those in flight keep theirs. The previous snapshot's
// idle upstream connections are closed. A snapshot built for fewer
// workers than the Manager has is refused (logged).
//
// Listener sockets and the HTTP connection settings (header, idle and
// write timeouts, header size) are fixed by New; a listener missing from snap,
// or with another protocol, answers 404 (http) or closes connections
// (tcp) until a snapshot has it again.
func (m *Manager) Publish(snap *Snapshot) {
	if snap == nil {
		return
	}
	if snap.Workers() < m.n {
		m.log.Error("snapshot refused: built for fewer workers", "snapshot_workers", snap.Workers(), "workers", m.n)
		return
	}
	for _, c := range snap.clusters {
		c.SetMembership(m.stats)
	}
	for w, wk := range m.workers {
		for name, wc := range snap.views[w] {
			if wc.Stats() == nil {
				wc.BindStats(upstream.NewStats(m.stats, name, w+1))
			}
		}
		wk.view.Store(m.buildView(snap, w))
	}
	m.mu.Lock()
	old := m.snap
	m.snap = snap
	m.mu.Unlock()
	if old != nil && old != snap {
		old.closeIdle()
	}
}

func (m *Manager) buildView(snap *Snapshot, w int) *workerView {
	v := &workerView{snap: snap, listeners: make([]*listenerView, len(m.listeners))}
	for i, ml := range m.listeners {
		ls := snap.listeners[ml.name]
		if ls == nil || ls.protocol != ml.protocol {
			if w == 0 {
				m.log.Warn("listener not in the published snapshot; it serves nothing", "listener", ml.name)
			}
			continue
		}
		lv := &listenerView{listenerSnap: ls}
		if ls.cluster != "" {
			lv.tcp = snap.views[w][ls.cluster]
		}
		if len(ls.routes) > 0 {
			lv.clusters = make([]*upstream.WorkerCluster, len(ls.routes))
			for j, r := range ls.routes {
				if r.cluster != "" {
					lv.clusters[j] = snap.views[w][r.cluster]
				}
			}
		}
		v.listeners[i] = lv
	}
	return v
}

// closeIdle closes the idle pooled upstream connections of every worker.
func (s *Snapshot) closeIdle() {
	for _, v := range s.views {
		for _, wc := range v {
			wc.CloseIdle()
		}
	}
}

// Sockets returns the listening sockets by key, as files (dups) that the
// caller may pass to another process.
//
// A listener steered by an eBPF program first lets go of its sockets in
// the program's socket array: the next generation puts them in its own
// (a socket can be in one array only), and until it attaches its program
// the kernel spreads by flow hash. A next generation that fails leaves
// this one with the kernel's spread; a rollback loads the program anew.
func (m *Manager) Sockets() (map[SocketKey]*os.File, error) {
	out := make(map[SocketKey]*os.File)
	for _, ml := range m.listeners {
		if ml.steer != nil {
			if err := ml.steer.Release(); err != nil {
				m.log.Warn("listener balance: cannot hand the sockets' steering over; the next generation will fall back to the kernel's flow hash",
					"listener", ml.name, "error", err)
			}
		}
	}
	for _, ml := range m.listeners {
		for _, s := range ml.sockets {
			f, err := s.ln.File()
			if err != nil {
				for _, f := range out {
					f.Close()
				}
				return nil, fmt.Errorf("listener %q: socket %q (worker %d): %w", ml.name, s.key.Address, s.key.Worker, err)
			}
			out[s.key] = f
		}
	}
	return out, nil
}

// Unused returns inherited sockets that no listener took. The caller owns
// them afterwards (a second call returns none); those never asked for are
// closed by Close.
func (m *Manager) Unused() map[SocketKey]*os.File {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.unused
	m.unused = nil
	if u == nil {
		u = map[SocketKey]*os.File{}
	}
	return u
}

// Stats returns the store the workers count into.
func (m *Manager) Stats() *stats.Store { return m.stats }

// acceptStopped reports whether accepting has stopped.
func (m *Manager) acceptStopped() bool {
	select {
	case <-m.stopAccept:
		return true
	default:
		return false
	}
}

// stopAccepting stops every accept loop and then closes this generation's
// descriptors of the listening sockets, once. With emptyQueues, each accept
// loop first takes what is still queued on its socket (for at most
// queueDrainMax): a socket that no successor holds — the last generation,
// or a listener the successor dropped — resets its queue when it closes.
// Where a successor holds the socket it accepts from the same queue, and
// whatever this generation leaves is the successor's.
func (m *Manager) stopAccepting(emptyQueues bool) {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.stopped = true
	if emptyQueues {
		m.emptyQueuesUntil.Store(monotime() + int64(queueDrainMax))
	}
	close(m.stopAccept)
	m.mu.Unlock()
	// A deadline in the past wakes every accept loop without touching
	// the socket itself.
	now := time.Now()
	for _, ml := range m.listeners {
		for _, s := range ml.sockets {
			s.ln.SetDeadline(now)
		}
	}
	m.acceptWG.Wait()
	for _, ml := range m.listeners {
		for _, s := range ml.sockets {
			s.close()
		}
	}
}

// forceDrain makes a running or future drain close whatever is left.
func (m *Manager) forceDrain(cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forceErr != nil {
		return
	}
	m.forceErr = cause
	close(m.force)
	m.cancel()
}

// queueDrainMax bounds how long a stopped accept loop keeps taking queued
// connections, so that a generation racing its successor on a busy shared
// queue stops at some point.
const queueDrainMax = time.Second

// DrainOptions say how a generation drains. The zero value is the default.
type DrainOptions struct {
	// HTTPTimeout closes HTTP connections (upgraded ones included) still
	// open this long after the drain began; zero leaves them to ctx.
	// TCP-proxy connections run until ctx ends.
	HTTPTimeout time.Duration
}

// drainIdleGrace: during a drain, a keep-alive connection idle this long
// is closed. Its client is not sending; a client that is sending gets
// "Connection: close" on its next response instead, and so never has a
// connection closed under a request it is about to send.
const drainIdleGrace = time.Second

// drainPoll is how often a drain looks at what is left.
const drainPoll = 20 * time.Millisecond

// Drain stops accepting on every listener, makes HTTP responses carry
// "Connection: close", closes keep-alive connections once idle for
// drainIdleGrace, and waits for in-flight HTTP requests and TCP
// connections to finish. Connections already accepted by the kernel are
// served, never reset. When ctx ends, whatever is left is closed. Drain is
// idempotent and safe to call concurrently: every call waits for the one
// drain (the first call's options apply); the first ctx to end forces it.
// It returns nil when everything finished by itself.
func (m *Manager) Drain(ctx context.Context, opts DrainOptions) error {
	m.drainOnce.Do(func() { go m.drain(opts) })
	select {
	case <-m.drainDone:
	case <-ctx.Done():
		m.forceDrain(context.Cause(ctx))
		<-m.drainDone
	}
	return m.drainErr
}

func (m *Manager) drain(opts DrainOptions) {
	defer close(m.drainDone)
	m.draining.Store(true)
	m.stopAccepting(m.queueEmptying)

	var httpDeadline <-chan time.Time
	if opts.HTTPTimeout > 0 {
		t := time.NewTimer(opts.HTTPTimeout)
		defer t.Stop()
		httpDeadline = t.C
	}
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	cut := 0
	for done := false; !done; {
		left, now := 0, monotime()
		for _, wk := range m.workers {
			left += wk.conns.closeIdle(now, drainIdleGrace)
		}
		if left == 0 {
			break
		}
		select {
		case <-tick.C:
		case <-httpDeadline:
			httpDeadline = nil
			for _, wk := range m.workers {
				cut += wk.conns.closeHTTP()
			}
		case <-m.force:
			for _, wk := range m.workers {
				cut += wk.conns.killAll()
			}
			done = true
		}
	}
	m.connWG.Wait()
	m.mu.Lock()
	snap, cause := m.snap, m.forceErr
	m.mu.Unlock()
	if snap != nil {
		snap.closeIdle()
	}
	if cut > 0 {
		if cause == nil {
			cause = fmt.Errorf("HTTP connections still open %v after the drain began", opts.HTTPTimeout)
		}
		m.drainErr = fmt.Errorf("workers: drain cut short: %d connections closed: %w", cut, cause)
	}
	m.log.Debug("drained", "closed_at_deadline", cut)
}

var errClosed = errors.New("workers: manager closed")

// Close closes every socket and connection at once.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.forceDrain(errClosed)
		m.stopAccepting(false)
		var errs []error
		for _, ml := range m.listeners {
			for _, s := range ml.sockets {
				if err := s.close(); err != nil && !errors.Is(err, net.ErrClosed) {
					errs = append(errs, fmt.Errorf("listener %q: %w", ml.name, err))
				}
			}
		}
		for _, wk := range m.workers {
			wk.conns.killAll()
		}
		m.acceptWG.Wait()
		m.budget.close() // no accept loop uses the spare any more
		m.connWG.Wait()
		m.mu.Lock()
		unused, snap := m.unused, m.snap
		m.unused = nil
		m.mu.Unlock()
		for _, f := range unused {
			if f != nil {
				f.Close()
			}
		}
		if snap != nil {
			snap.closeIdle()
		}
		m.mu.Lock()
		started := m.started
		m.mu.Unlock()
		close(m.stopMigrations)
		if started {
			<-m.migrationsDone
		}
		for _, ml := range m.listeners {
			if ml.steer != nil {
				errs = append(errs, ml.steer.Close())
			}
		}
		// Last: the queued lines of every request served are written.
		for _, ml := range m.listeners {
			for _, al := range ml.accessLogs {
				errs = append(errs, al.Close())
			}
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// connSet is a worker's client connections (HTTP, upgraded HTTP, TCP
// sessions), so that a drain can wait for them, close the idle ones and
// close the rest at its deadline. Touched once when a connection starts and
// once when it ends, by that worker's connections only: never per request.
type connSet struct {
	mu     sync.Mutex // guards m and killed
	m      map[io.Closer]struct{}
	killed bool
}

// add registers c; false means the set was killed and c must be closed.
func (s *connSet) add(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.killed {
		return false
	}
	if s.m == nil {
		s.m = make(map[io.Closer]struct{})
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c io.Closer) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// closeIdle closes the HTTP connections idle between requests for at least
// grace and returns how many connections remain.
func (s *connSet) closeIdle(now int64, grace time.Duration) int {
	var idle []*clientConn
	s.mu.Lock()
	for c := range s.m {
		if tc, ok := c.(*clientConn); ok && tc.idleFor(now) >= grace {
			idle = append(idle, tc)
		}
	}
	left := len(s.m) - len(idle)
	s.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
	return left
}

// closeHTTP closes every HTTP connection in the set, busy or not, and
// returns how many.
func (s *connSet) closeHTTP() int {
	var cs []*clientConn
	s.mu.Lock()
	for c := range s.m {
		if tc, ok := c.(*clientConn); ok {
			cs = append(cs, tc)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}

// killAll closes every connection in the set, and any added later.
func (s *connSet) killAll() int {
	s.mu.Lock()
	s.killed = true
	cs := make([]io.Closer, 0, len(s.m))
	for c := range s.m {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}
