// Package workers runs the per-core workers: each owns its listener sockets,
// its accept loops, its connections and its upstream pools, and reads the
// configuration only through an immutable snapshot that the main thread
// publishes to it (DESIGN §3). It serves nothing itself: an accepted
// connection goes to the HTTP front end (downstream/http) or the TCP one
// (downstream/tcp).
package workers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/downstream/tcp"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/stats"
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
// the default. The listeners, their settings and the connection bounds
// come from the Snapshot given to New: the only door into the data path.
type Options struct {
	Concurrency int          // resolved worker count (>= 1)
	Logger      hclog.Logger // nil: a null logger
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
	// ServerTLS is the TLS server config of every listener with
	// [listeners.tls], by listener name, built by the caller (package
	// tlsconf: certificates picked by SNI and swapped on rotation,
	// session-ticket keys handed over between generations). A listener
	// with TLS and no entry here is an error.
	ServerTLS map[string]*tls.Config
	// HeartbeatInterval is how often at least every accept loop stores
	// its heartbeat (WorkerHeartbeatAges), waking for it when idle; 0
	// keeps none.
	HeartbeatInterval time.Duration
}

// Manager owns all workers of one generation.
type Manager struct {
	log hclog.Logger
	// grpcToHTTP1 warns, rate-limited, of gRPC requests routed to a
	// cluster that speaks HTTP/1.1 (downstream/http/h2front_h1.go).
	grpcToHTTP1 ratelog.Limiter
	n           int
	workers     []*worker
	stats       *stats.Store
	// budget bounds the open client connections (connlimit.go).
	budget *connBudget
	// reusePort is the snapshot's server.reuse_port, fixed at New: a
	// listener added later is opened as the first ones were.
	reusePort bool

	// ctx ends at Close or when a drain is forced; it aborts upstream
	// dials of TCP-proxy connections.
	ctx    context.Context
	cancel context.CancelFunc

	// draining: the whole Manager drains (Drain); every listener's own
	// flag is set too.
	draining atomic.Bool
	// emptyQueuesUntil: once accepting stops, the accept loops take what
	// is still queued on their sockets until this monotime (0: they do
	// not, the Manager is being closed at once).
	emptyQueuesUntil atomic.Int64
	// queueEmptying: a drain empties the queues (off only by
	// queueEmptyingEnv).
	queueEmptying bool
	// http is what every HTTP connection shares (downstream/http).
	http httpfront.Env

	overloadFields // the overload manager's pass count, counters (overload.go)

	// stopMigrations ends countMigrations (Close); migrationsDone closes
	// once it has counted the last migration.
	stopMigrations chan struct{}
	migrationsDone chan struct{}
	// heartbeatEvery is Options.HeartbeatInterval.
	heartbeatEvery time.Duration
	// reclaimDone closes when the reclaimer (reclaim.go), which
	// stopMigrations ends too, has returned.
	reclaimDone chan struct{}
	// parkIdleAfter is the park grace (parksweep.go): an HTTP/1.1
	// connection of a listener with park_idle_connections parks once
	// idle for this long (a listener without it has no connection
	// the sweep asks). Set by New (tests may shorten it before Start).
	parkIdleAfter time.Duration

	mu       sync.Mutex // guards the fields below
	started  bool
	stopped  bool // accepting stopped (drain or close)
	unused   map[SocketKey]*os.File
	snap     *Snapshot  // the published one
	forceErr error      // why the drain was forced
	beats    []loopBeat // every accept loop's heartbeat, set by Start
	// listeners are the listeners serving now, in the snapshot's order
	// (replaced whole by UpdateListeners: a reader may keep the slice it
	// took under mu).
	listeners []*mlistener
	// retiring are the listeners that UpdateListeners removed or
	// replaced and that still drain (update.go).
	retiring []*mlistener
	// nextIdx is the index the next listener gets: indices are never
	// reused, so that a view, an overload state or a connection of a
	// retired listener never meets another listener at its index.
	nextIdx int
	// overload is the state SetOverload published last (nil: none), for
	// the listeners added after it.
	overload *OverloadState

	stopAccept chan struct{}  // closed when accepting stops
	force      chan struct{}  // closed: close whatever is left now
	connWG     sync.WaitGroup // TCP-proxy sessions
	retireWG   sync.WaitGroup // the drains of retiring listeners (update.go)

	drainOnce sync.Once
	drainDone chan struct{}
	drainErr  error
	closeOnce sync.Once
	closeErr  error
}

// mlistener is one configured listener with its sockets and, for HTTP,
// its connection settings: one instance of a listener. A listener that
// UpdateListeners changes is served by a new instance (same name, new
// index) while the old one drains alone.
type mlistener struct {
	idx      int
	name     string
	addr     string
	protocol string
	sockets  []*socket
	// spec is the snapshot's listener this instance was built from: a
	// later snapshot whose listener of that name has the same fixed
	// settings (sameFixed) keeps the instance as it is.
	spec *listenerSnap
	h1   *httpfront.Settings // http
	h2   httpfront.H2Params  // http
	// http2Cleartext: a connection that opens with the HTTP/2 preface
	// is served as HTTP/2 (h2c with prior knowledge).
	http2Cleartext bool
	slots          *connSlots // the listener's connection bound, shared by its workers
	// tls terminates TLS on the listener's connections (tls.go); nil:
	// plaintext, or passed through untouched (sni_routes).
	tls *listenerTLS

	balance string // config: least_conn, hash, kernel ("" is kernel)
	// steer is the eBPF program that spreads the listener's connections
	// over its workers' sockets and migrates a closing socket's queue;
	// nil: the kernel's flow hash (steerErr says why, when the program
	// was wanted).
	steer           *steering.Group
	steerErr        error
	steerUnloadable bool   // steerErr is the kernel refusing the program itself
	protection      string // what protects a closing socket's queue, as logged
	// accessLogs are the listener's access logs, opened with it and
	// closed after its last request (accesslog.go).
	accessLogs []*accesslog.Logger
	// perWorker is what each worker holds of the listener, by worker.
	perWorker []*listenerWorker

	// The listener's own stop, so that it can drain alone (update.go):
	// stopAccept closes when its accept loops are to stop (stopped, under
	// Manager.mu, says it did); acceptWG counts them.
	stopAccept chan struct{}
	stopped    bool
	acceptWG   sync.WaitGroup
	// emptyQueuesUntil is Manager.emptyQueuesUntil for a listener that
	// drains alone (0: the Manager's applies).
	emptyQueuesUntil atomic.Int64
	// draining makes the listener's HTTP responses carry "Connection:
	// close" (httpfront.Listener.Draining); httpWG counts its HTTP
	// connections' goroutines (httpfront.Listener.ConnWG).
	draining atomic.Bool
	httpWG   sync.WaitGroup
	// kernelSeen is how much of its program's ShedRefused is already in
	// overload.stop_accepting.refused (overload.go).
	kernelSeen atomic.Uint64

	closeOnce sync.Once // closeResources
	closeErr  error
}

// listenerWorker is what one worker holds of one listener.
type listenerWorker struct {
	stats *listenerStats
	// http is the listener as the front end serves it on this worker
	// (nil: tcp).
	http *httpfront.Listener
}

// worker is one worker's state. Nothing in it is written by another
// worker.
type worker struct {
	id    int
	view  atomic.Pointer[workerView]
	conns connSet   // client connections: HTTP, upgraded, TCP sessions
	pool  servePool // goroutines parked between HTTP connections (servepool.go)
	// front is the HTTP front end's state of this worker: what the
	// overload manager asks now (overload.go), the buffers its
	// connections hold (reclaim.go), its idle poller.
	front httpfront.Worker
	// parkDue is the park sweep's list of connections to ask, kept
	// between sweeps (parksweep.go); the reclaimer's goroutine's.
	parkDue []*httpfront.Conn
}

// workerView is one worker's view of a snapshot (RCU: replaced whole by
// Publish, loaded once per connection or request).
type workerView struct {
	snap      *Snapshot
	listeners []*listenerView // index: mlistener.idx; nil: not in the snapshot
}

type listenerView struct {
	*listenerSnap
	// tcp is a tcp listener's view for the TCP front end (its cluster,
	// or the passthrough's clusters by sni_route); nil for http.
	tcp *tcp.Listener
	// http is an http listener's view for the HTTP front end (its
	// routes and their clusters); nil for tcp.
	http *httpfront.View
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
	// TLS configs first: a listener without one fails before any socket
	// is bound.
	listenerTLSs := make([]*listenerTLS, len(snap.order))
	for i, name := range snap.order {
		lt, err := newListenerTLS(snap.listeners[name], opts.ServerTLS)
		if err != nil {
			closeInherited()
			return nil, fmt.Errorf("workers: %w", err)
		}
		listenerTLSs[i] = lt
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		log:         log,
		grpcToHTTP1: ratelog.Limiter{Log: log},
		n:           n,
		stats:       st,
		reusePort:   snap.reusePort,
		ctx:         ctx,
		cancel:      cancel,
		stopAccept:  make(chan struct{}),
		force:       make(chan struct{}),

		stopMigrations: make(chan struct{}),
		migrationsDone: make(chan struct{}),
		reclaimDone:    make(chan struct{}),
		drainDone:      make(chan struct{}),
		heartbeatEvery: opts.HeartbeatInterval,
	}
	// Always: a listener that parks may come later (UpdateListeners),
	// and a sweep with nothing parkable only walks the sets.
	m.parkIdleAfter = httpfront.ParkIdleAfter
	m.http = httpfront.Env{Ctx: ctx, Log: log, OverloadPass: &m.overloadPass, GRPCToHTTP1: &m.grpcToHTTP1}
	m.queueEmptying = os.Getenv(queueEmptyingEnv) != "off"
	var opened []*mlistener
	for i, name := range snap.order {
		ml, err := m.openListener(snap.listeners[name], listenerTLSs[i], snap.id.Epoch, inh)
		if err != nil {
			for _, ml := range opened {
				ml.closeUnstarted()
			}
			closeInherited()
			cancel()
			return nil, err
		}
		opened = append(opened, ml)
	}
	// Only once every listener is open: a generation that fails in New
	// never takes a socket group from the previous generation's program.
	for _, ml := range opened {
		attachSteering(ml, n, len(opts.Inherited) > 0)
	}
	m.unused = inh
	for _, ml := range opened {
		logSteering(log, ml, m.queueEmptying)
	}
	m.budget = newConnBudget(snap.maxConnections, log)
	m.workers = make([]*worker, n)
	for w := range m.workers {
		wk := &worker{id: w, pool: newServePool()}
		wk.conns.idle = &wk.front
		m.workers[w] = wk
	}
	for _, ml := range opened {
		m.joinListener(ml, nil)
	}
	m.listeners = opened
	m.Publish(snap)
	if log.IsDebug() {
		for _, ml := range m.listeners {
			log.Debug("listener ready", "listener", ml.name, "address", ml.addr, "protocol", ml.protocol, "sockets", len(ml.sockets))
		}
	}
	return m, nil
}

// openListener opens the access logs and the sockets of listener ls (a new
// instance, with the next index), binding or adopting from inh
// (openSockets). On error nothing of it stays open; inh keeps what it did
// not take.
func (m *Manager) openListener(ls *listenerSnap, lt *listenerTLS, epoch int, inh map[SocketKey]*os.File) (*mlistener, error) {
	ml := &mlistener{idx: m.nextIdx, name: ls.name, addr: ls.address, protocol: ls.protocol, balance: ls.balance,
		spec: ls, tls: lt, h1: ls.h1, h2: ls.h2, http2Cleartext: ls.http2Cleartext, stopAccept: make(chan struct{})}
	m.nextIdx++
	err := m.openAccessLogs(ml, ls.accessLogs, epoch)
	if err == nil {
		startSteering(ml, m.n, m.reusePort)
		err = openSockets(ml, m.n, m.reusePort, inh)
	}
	if err == nil {
		err = prepareHTTP(ml)
	}
	if err != nil {
		ml.closeUnstarted()
		return nil, err
	}
	return ml, nil
}

// closeUnstarted closes what openListener opened of a listener that never
// served.
func (ml *mlistener) closeUnstarted() {
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

// joinListener gives ml its connection slots (sharing open, the count of
// the listener of the same name it replaces, if any) and its stats and
// front-end listener on every worker. Before ml serves.
func (m *Manager) joinListener(ml *mlistener, open *paddedCount) {
	ls := ml.spec
	ml.slots = newConnSlots(m.budget, open, ls, m.log)
	ml.perWorker = make([]*listenerWorker, m.n)
	for w, wk := range m.workers {
		st := newListenerStats(m.stats, ml.name, w)
		st.steerActive = activeCount(ml, w)
		if ml.tls != nil {
			st.tls = newTLSStats(m.stats, ml.name, w)
		}
		if len(ls.sniRoutes) > 0 {
			st.sniNoRoute = m.stats.Counter("listener." + ml.name + "." + tcp.StatSNINoRoute).Lane(w + 1)
		}
		lw := &listenerWorker{stats: st}
		lw.http = m.newHTTPListener(wk, ml, st)
		ml.perWorker[w] = lw
	}
	if ml.steer != nil {
		// Declared now, not at the migration counter's first flush
		// (up to migratedPoll later): until then hotproxy stats
		// --retired would show the listener's count as no live
		// generation's.
		m.stats.Counter("listener." + ml.name + "." + statBalanceMigrated)
	}
}

// currentListeners returns the listeners serving now (a slice nobody
// changes: UpdateListeners replaces it whole).
func (m *Manager) currentListeners() []*mlistener {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listeners
}

// allListeners returns the listeners serving now and those still
// draining after UpdateListeners removed or replaced them.
func (m *Manager) allListeners() []*mlistener {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(slices.Clip(m.listeners), m.retiring...)
}

// Addr returns the local address of the named listener's first socket
// (useful when the config says port 0), or nil.
func (m *Manager) Addr(listener string) net.Addr {
	for _, ml := range m.currentListeners() {
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
	go func() {
		defer close(m.reclaimDone)
		m.runReclaimer(m.stopMigrations)
	}()
	for _, ml := range m.listeners {
		m.startListenerLocked(ml)
	}
}

// startListenerLocked starts ml's accept loops on every worker (m.mu
// held).
func (m *Manager) startListenerLocked(ml *mlistener) {
	for _, s := range ml.sockets {
		for w, wk := range m.workers {
			if s.owner >= 0 && s.owner%m.n != w {
				continue
			}
			lw := ml.perWorker[w]
			a := &acceptor{m: m, ml: ml, s: s, wk: wk, lw: lw, li: ml.idx, st: lw.stats, slots: ml.slots}
			if s.raw != nil {
				a.raw = s.raw.NewAcceptor()
			}
			if m.heartbeatEvery > 0 {
				// The loops of a shared socket take turns in
				// accept(2): each gets its share of the interval.
				a.hb, a.beatEvery = new(heartbeat), m.heartbeatEvery/time.Duration(s.loops(m.n))
				a.hb.at.Store(monotime())
				m.beats = append(m.beats, loopBeat{worker: w, hb: a.hb, ml: ml})
			}
			s.acceptors.Add(1)
			ml.acceptWG.Add(1)
			if ml.protocol == config.ProtocolHTTP {
				go m.acceptHTTP(a)
			} else {
				go m.acceptTCP(a)
			}
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
	for _, ml := range m.currentListeners() {
		if ml.steer != nil {
			if err := ml.steer.Release(); err != nil {
				m.log.Warn("listener balance: cannot hand the sockets' steering over; the next generation will fall back to the kernel's flow hash",
					"listener", ml.name, "error", err)
			}
		}
	}
	return m.SocketDups()
}

// Resteer takes back the steering of every listener none of whose
// sockets the successor took (unused: a listener its config dropped),
// which Sockets had let go of for it: so that the drain's RefuseNew
// refuses new connections to it in the kernel while its queue empties.
// Without that the kernel's flow hash kept queueing them, and the
// socket's close at the end of queueDrainMax reset them
// (TestHotRestartRemovedListenerIsNeverReset). Where it cannot, the
// listener stays on the kernel's spread and the drain closes it as soon
// as its queue is empty.
func (m *Manager) Resteer(unused map[SocketKey]bool) {
	for _, ml := range m.currentListeners() {
		if ml.steer == nil || len(ml.sockets) == 0 {
			continue
		}
		all := true
		for _, s := range ml.sockets {
			all = all && unused[s.key]
		}
		if !all {
			continue
		}
		// Under mu: the migration counter reads ml.steer
		// (steeredListeners).
		m.mu.Lock()
		attachSteering(ml, len(m.workers), false)
		m.mu.Unlock()
		if ml.steer == nil {
			m.log.Warn("listener balance: cannot take back the steering of a listener the next generation dropped; its queue is emptied without it",
				"listener", ml.name, "error", ml.steerErr)
		}
	}
}

// TakeBackClosing returns, as files (dups), the sockets this draining
// Manager was closing for good and still has open (a listener the
// successor dropped), and leaves them to whoever takes the files: a
// rollback serves that listener on them, with what is queued in them,
// where a fresh bind would fail with "address already in use" while they
// are open and a close would reset their queues. This Manager stops
// waiting on them as it does on sockets handed over.
func (m *Manager) TakeBackClosing() map[SocketKey]*os.File {
	out := make(map[SocketKey]*os.File)
	for _, ml := range m.currentListeners() {
		for _, s := range ml.sockets {
			if s.handedOver.Swap(true) {
				continue
			}
			f, err := s.ln.File()
			if err != nil {
				continue // closed already: the rollback binds afresh
			}
			out[s.key] = f
		}
	}
	return out
}

// SocketDups returns the listening sockets by key, as files (dups), and
// leaves their steering alone: for a copy that nobody accepts on while
// this generation serves (the supervisor's, see hotrestart.SupervisorLink).
func (m *Manager) SocketDups() (map[SocketKey]*os.File, error) {
	out := make(map[SocketKey]*os.File)
	for _, ml := range m.currentListeners() {
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
