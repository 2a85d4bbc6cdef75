// Package server is one generation's main thread: it builds every piece of
// state from a validated config before touching a socket, binds, starts the
// workers and the admin API, owns the lifecycle state and signals, and
// drains the generation when it is told to stop.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/tlsconf"
	"github.com/hotproxy/hotproxy/workers"
)

// State is where a generation is in its life.
type State int32

const (
	StateInitializing State = iota
	StateLive
	StateDraining
)

func (s State) String() string {
	switch s {
	case StateInitializing:
		return "INITIALIZING"
	case StateLive:
		return "LIVE"
	case StateDraining:
		return "DRAINING"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Options configures a generation. The zero value of each optional field is
// the default.
type Options struct {
	// Config is the loaded, validated configuration.
	Config *config.Config
	// Epoch is this generation's hot-restart epoch: 0 starts cold, N > 0
	// takes over from the running generation of epoch N-1.
	Epoch int
	// BaseID tells apart independent hotproxy instances on one machine:
	// it names their restart sockets and their stats regions (default
	// /dev/shm/hotproxy.<base-id>.stats, see config [stats] path).
	BaseID int
	// AllowColdStart lets a generation of epoch N > 0 start cold when no
	// generation of epoch N-1 answers.
	AllowColdStart bool
	// Parent is the generation of epoch N-1 to take over from: the
	// supervisor says which, by pid and start time, from its own process
	// table (--restart-parent). A listener at the restart socket that is
	// not it is skipped before it is told anything. The zero value takes
	// any generation of this user or root (a hand-started `serve`, or a
	// take-over from another container).
	Parent hotrestart.ExpectedParent
	// NoParent: no generation of epoch N-1 serves (the supervisor says so:
	// it crashed), so this one starts cold and dials nothing, whatever
	// listens at the restart socket (--restart-parent none).
	NoParent bool
	// SupervisorPID is the pid of the supervisor this generation runs
	// under (hotrestart.SupervisorFromEnv), 0 for none. A supervised
	// generation says so to the one it takes over from, and hands over
	// only to a generation that its supervisor started (or that runs
	// under a supervisor of its own): never to one typed into a shell.
	SupervisorPID int
	// OnReady, when set, is called once the generation serves (and has
	// told the generation it took over from to drain).
	OnReady func()
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// LogFile, if set, is the file Logger writes to ([log] path): SIGUSR1
	// reopens it, with the access logs.
	LogFile *LogFile
	// HandleSignals makes Run stop on SIGTERM and SIGINT. Off for
	// embedding in tests, which cancel Run's context instead.
	HandleSignals bool
	// StopAfterTakeover is fault injection for tests: the generation
	// stops itself (SIGSTOP) right after it has received the previous
	// generation's sockets, before it serves, so that a test can kill it
	// at the worst moment for the previous one.
	StopAfterTakeover bool
	// SupervisorLink is this generation's end of its link to the
	// supervisor (serve --supervisor-fd; hotrestart.SupervisorLink),
	// nil for none. New takes it over.
	SupervisorLink *os.File
	// TakeKeptSockets: the generation this one replaces died or wedged,
	// and the supervisor kept its listening sockets: take them from the
	// link instead of dialing a restart socket (--restart-parent kept).
	TakeKeptSockets bool
	// TestBlockMainAfter is fault injection for tests: once the
	// generation has served this long, its main loop blocks for good, as
	// a wedged one would (0: never).
	TestBlockMainAfter time.Duration
	// DynamicUpdates are the dynamic configurations to apply (issue 23:
	// the xDS client's accepted state of the world), read by the main
	// goroutine while the generation serves; each one's Done is called
	// with the outcome (nil: serving it; an error: refused, the previous
	// configuration serving on, its text the NACK's error_detail). nil:
	// the configuration is the file's alone.
	DynamicUpdates <-chan *DynamicUpdate
	// InitialDynamic, when set, is served from the start together with
	// the file's resources: the dynamic configuration the previous
	// generation handed over, so that a hot restart while the control
	// plane is down serves the same configuration. An error in it stops
	// New, like one in the file.
	InitialDynamic *DynamicSet
}

// Server is one generation.
type Server struct {
	opts        Options
	cfg         *config.Config
	log         hclog.Logger
	concurrency int
	started     time.Time
	// firstStart is when epoch 0 started: this generation's start, or
	// what the generation it took over from said.
	firstStart time.Time
	identity   workers.Identity

	state        atomic.Int32 // a State
	healthFailed atomic.Bool  // POST /healthcheck/fail
	// handoverPublished mirrors hr.state (a handoverState) for the admin
	// API; only setHandover writes it.
	handoverPublished atomic.Int32

	// snapshot is the one the workers serve now. The main goroutine
	// replaces it (dynamic configuration, dynamic.go); the admin API
	// reads it.
	snapshot atomic.Pointer[workers.Snapshot]
	// tls is the listeners' TLS (tls.go): the configs the workers hold,
	// their certificates' watch and their session-ticket keys. The main
	// goroutine replaces it when dynamic listeners change (setTLS);
	// other goroutines read tlsNow.
	tls    *tlsconf.Set
	tlsNow atomic.Pointer[tlsconf.Set]
	// dyn is the dynamic configuration (dynamic.go).
	dyn     dynamicState
	health  healthMonitors // see health.go
	workers *workers.Manager
	adminLn *adminListener
	admin   *http.Server

	// overload is the overload manager (overload.go); nil: off.
	overload *overloadManager

	// takeover is the child side of hot restart, hr the parent side.
	takeover takeover
	hr       handover
	// link is the link to the supervisor (supervisor_link.go), nil for
	// none; wd the watchdog (watchdog.go).
	link *hotrestart.SupervisorLink
	wd   *watchdog

	// region and stats are this generation's share of the stats region
	// (see stats.go); srvStats its server.* gauges on lane 0.
	region   *shm.Region
	stats    *stats.Store
	srvStats serverStats
	// xds counts what the xDS client reports (xds.go); nil: [xds] off.
	xds *xdsStats
	// xdsc is the xDS client of [xds] (xds_client.go); nil: off. xdsNow
	// is the same, for the restart socket's sessions.
	xdsc   *xdsLink
	xdsNow atomic.Pointer[xdsLink]
	// statsKick asks the flush loop to publish a state change now.
	statsKick chan struct{}
	// statsMu guards statsClosed: admin reads of the region end before
	// the region is unmapped.
	statsMu     sync.RWMutex
	statsClosed bool

	// quit receives a reason when something other than a signal or the
	// context asks the generation to stop (the admin API).
	quit     chan string
	quitOnce sync.Once

	// reopen receives SIGUSR1 (accesslog.go), from New on: a signal
	// forwarded while the generation starts must not kill it.
	reopen     <-chan os.Signal
	stopReopen func()
	// tlsReload receives SIGUSR2 (tls.go), from New on; stopReopen
	// stops it too.
	tlsReload <-chan os.Signal
}

// New builds the generation: everything derived from config first (routes,
// clusters: any error here leaves no socket touched), then it attaches to
// the stats region (a region file it cannot use stops it here, before the
// previous generation is contacted or a socket is bound), then the listener
// sockets and the admin listener. The generation does not serve until Run.
func New(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("server: no config")
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg := opts.Config
	s := &Server{
		opts:        opts,
		cfg:         cfg,
		log:         log,
		concurrency: workers.Concurrency(cfg),
		started:     time.Now(),
		quit:        make(chan string, 1),
		hr:          newHandover(),
		dyn:         newDynamicState(cfg),
		statsKick:   make(chan struct{}, 1),
	}
	s.firstStart = s.started
	s.reopen, s.stopReopen = s.reopenSignals()
	var stopTLSReload func()
	s.tlsReload, stopTLSReload = s.tlsReloadSignals()
	stopReopen := s.stopReopen
	s.stopReopen = func() { stopReopen(); stopTLSReload() }
	hostname, _ := os.Hostname()
	s.identity = workers.Identity{
		Version:  version.Version,
		Epoch:    opts.Epoch,
		PID:      os.Getpid(),
		Hostname: hostname,
	}

	// A generation that takes over may start with the dynamic
	// configuration its predecessor handed over: merged and built here,
	// before anything is bound, so that its listeners adopt their
	// sockets rather than binding anew.
	merged := cfg
	if opts.InitialDynamic != nil {
		var err error
		if merged, err = s.mergeDynamic(opts.InitialDynamic); err != nil {
			s.stopReopen()
			return nil, err
		}
		s.dyn.view.Store(s.viewOf(merged, opts.InitialDynamic))
	}
	prep, err := Prepare(merged, s.identity)
	if err != nil {
		s.stopReopen()
		return nil, err
	}
	s.snapshot.Store(prep.Snapshot)
	s.setTLS(prep.TLS)
	s.dyn.merged = merged
	s.startHealthChecks()

	// The hand-over comes first (DESIGN §4): the previous generation
	// checks who this is before anything of theirs is touched, the stats
	// region included. Nothing is bound yet.
	var inherited map[workers.SocketKey]*os.File
	var adminLn net.Listener
	if err := s.openSupervisorLink(); err != nil {
		s.stopReopen()
		return nil, err
	}
	switch {
	case opts.TakeKeptSockets:
		if inherited, adminLn, err = s.takeKeptSockets(); err != nil {
			s.closeSupervisorLink()
			s.stopReopen()
			return nil, err
		}
	case opts.Epoch > 0:
		if inherited, adminLn, err = s.takeOver(); err != nil {
			s.closeSupervisorLink()
			s.stopXDS() // started with the predecessor's resources
			s.stopReopen()
			return nil, err
		}
	}
	// From here on, a failure must give back what was taken over.
	fail := func(err error) (*Server, error) {
		closeSocketFiles(inherited)
		if adminLn != nil {
			adminLn.Close()
		}
		s.closeHotRestart()
		s.closeSupervisorLink()
		s.tls.Close()
		s.stopHealthMonitors()
		s.closeStats()
		s.stopXDS()
		s.stopReopen()
		return nil, err
	}
	if err := s.openStats(); err != nil {
		return fail(err)
	}
	s.tls.Start(tlsconf.StartOptions{Stats: s.stats, Logger: log})
	s.xds = newXDSStats(cfg.XDS, s.stats, log)
	if s.xdsc != nil {
		s.xdsc.events.Store(s.xds)
		if st := s.xdsc.accepted.Load(); st != nil {
			// Handed over: the gauges show the versions served.
			for t, v := range st.Versions {
				s.xds.setVersion(t.Name(), v)
			}
		}
	}
	if err := s.startXDS(nil); err != nil {
		return fail(err)
	}
	s.runHealthMonitors()
	if err := s.listenForSuccessor(); err != nil {
		return fail(err)
	}
	s.workers, err = workers.New(workers.Options{
		Concurrency: s.concurrency,
		Logger:      log,
		Inherited:   inherited,
		Stats:       s.stats,
		ServerTLS:   s.tls.ServerConfigs(),

		HeartbeatInterval: s.wd.interval(),
	}, s.snapshot.Load()) // New's, or the one with the handed-over xDS resources
	inherited = nil // workers.New owns them now, on success and failure
	if err != nil {
		return fail(err)
	}
	// Sockets the previous generation had and this one does not want
	// (a listener removed or moved): this one lets go of them now, and
	// tells the previous generation with the drain, which then empties
	// their queues and closes them for good.
	for k, f := range s.workers.Unused() {
		f.Close()
		s.takeover.unused = append(s.takeover.unused, hotrestart.Socket{Network: k.Network, Address: k.Address, Worker: k.Worker, Role: hotrestart.RoleListener})
	}
	if adminLn == nil {
		adminLn, err = net.Listen("tcp", cfg.Admin.Address)
		if err != nil {
			s.workers.Close()
			return fail(fmt.Errorf("admin: address %q: %w%s", cfg.Admin.Address, err, bindHint(err)))
		}
	}
	s.overload = newOverloadManager(cfg, s.workers, s.stats, log)
	s.adminLn = &adminListener{Listener: adminLn}
	s.admin = s.newAdminServer()
	return s, nil
}

func (s *Server) newAdminServer() *http.Server {
	return &http.Server{
		Handler:           s.adminHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          s.log.Named("admin").StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
}

// State reports the generation's lifecycle state.
func (s *Server) State() State { return State(s.state.Load()) }

// AdminAddr is the address the admin API listens on.
func (s *Server) AdminAddr() net.Addr { return s.adminLn.Addr() }

// Run serves until ctx ends, a stop signal arrives (with
// Options.HandleSignals), the admin API is told to quit, or the generation
// has handed over to the next one; then it drains the generation and
// returns. A second signal during a drain closes everything at once.
func (s *Server) Run(ctx context.Context) error {
	defer s.closeSupervisorLink()
	defer s.closeHotRestart()
	defer s.runStats()()
	defer func() { s.tls.Close() }() // the set serving at the end
	defer s.stopHealthMonitors()
	defer s.stopRetiredDynamic()
	defer s.stopXDS()
	sigs := make(chan os.Signal, 2)
	if s.opts.HandleSignals {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		// Once Run returns the generation is on its way out: a stop
		// signal then (a supervisor hurrying a draining generation that
		// has just finished) must not kill it by the default action and
		// turn a clean exit into "killed by SIGTERM".
		defer signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	}

	defer s.stopReopen()
	overloadTick, stopOverloadTick := s.overload.ticker()
	defer stopOverloadTick()
	defer s.overload.stop()

	s.workers.Start()
	go s.hr.listener.Serve()
	s.setState(StateLive)
	s.startWatchdog()
	beat := time.NewTicker(s.wd.interval())
	defer beat.Stop()
	// With [xds] and nothing handed over: ready once the first warm set
	// serves, or initial_fetch_timeout has passed.
	if reason := s.awaitFirstXDS(ctx, sigs, beat.C); reason != "" {
		s.stopWatchdog()
		go s.admin.Serve(s.adminLn)
		return s.drain(reason, sigs)
	}
	var blockMain <-chan time.Time
	if s.opts.TestBlockMainAfter > 0 {
		t := time.NewTimer(s.opts.TestBlockMainAfter)
		defer t.Stop()
		blockMain = t.C
	}
	// The admin API starts once the generation is LIVE, so that a
	// successor's /ready never answers for a generation still starting.
	adminDone := make(chan error, 1)
	go func() { adminDone <- s.admin.Serve(s.adminLn) }()
	s.log.Info("serving", "epoch", s.opts.Epoch, "pid", s.identity.PID,
		"concurrency", s.concurrency, "listeners", len(s.dyn.merged.Listeners), "admin", s.adminLn.Addr().String())
	// Before the previous generation drains: the set sent replaces its
	// set at the supervisor, and a socket this one dropped must not stay
	// open there.
	s.keepSocketsWithSupervisor()
	s.tellPredecessorToDrain()
	if s.opts.OnReady != nil {
		s.opts.OnReady()
	}

	reason := ""
	for reason == "" && s.hr.state != handoverDrained {
		commit, drained := s.handoverChannels()
		select {
		case <-beat.C:
			s.wd.beatMain()
		case <-blockMain:
			s.log.Warn("blocking the main loop for good, as --test-block-main-after asks (a test of the watchdog)")
			select {}
		case <-ctx.Done():
			reason = "context ended"
		case r := <-s.quit:
			reason = r
		case err := <-adminDone:
			if s.State() == StateLive && !errors.Is(err, http.ErrServerClosed) {
				// The admin API going dark is not a reason to drop
				// traffic; say so loudly and keep serving.
				s.log.Error("admin API stopped serving", "error", err)
			}
			adminDone = nil
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.log.Info("SIGHUP ignored: reloading is the supervisor's job (hotproxy supervise)")
				continue
			}
			reason = "signal " + sig.String()
		case <-s.reopen:
			s.reopenLogs()
		case <-s.tlsReload:
			go s.reloadCertificates("SIGUSR2")
		case reply := <-s.hr.sockets:
			reply <- s.socketsForSuccessor()
		case ev := <-s.hr.events:
			s.onHandoverEvent(ev)
		case <-commit:
			s.commitHandover("the next generation has served for the commit window")
		case err := <-drained:
			s.onDrained(err)
		case now := <-overloadTick:
			s.overload.pass(now)
		case u := <-s.opts.DynamicUpdates:
			u.done(s.applyDynamic(u.Set))
		case u := <-s.xdsUpdates():
			s.applyXDS(u)
		case r := <-s.dyn.retired:
			s.onDynamicRetired(r)
		}
	}
	s.stopWatchdog()
	if reason == "" {
		s.log.Info("handed over and drained: exiting", "epoch", s.opts.Epoch, "pid", s.identity.PID)
		s.closeRetired()
		closeAdmin(s.admin)
		return nil
	}
	if !s.hr.state.serving() {
		return s.finishHandover(reason, sigs)
	}
	return s.drain(reason, sigs)
}

// drain stops the generation gracefully: /ready turns 503, workers stop
// accepting and finish what is in flight within drain_time, and the admin
// API goes last so the drain can be watched.
func (s *Server) drain(reason string, sigs <-chan os.Signal) error {
	s.setState(StateDraining)
	drainTime := s.cfg.Server.DrainTime.D()
	s.log.Info("draining", "reason", reason, "drain_time", drainTime)

	ctx, cancel := context.WithTimeout(context.Background(), drainTime)
	defer cancel()
	go func() {
		select {
		case sig := <-sigs:
			s.log.Warn("second signal during drain: closing every connection now", "signal", sig.String())
			cancel()
		case <-ctx.Done():
		}
	}()

	start := time.Now()
	err := s.workers.Drain(ctx, workers.DrainOptions{})
	s.workers.Close()
	s.closeRetired()
	if err != nil {
		s.log.Warn("drain ended before every connection finished", "error", err, "after", time.Since(start).Round(time.Millisecond))
	} else {
		s.log.Info("drained", "after", time.Since(start).Round(time.Millisecond))
	}

	closeAdmin(s.admin)
	return nil
}

// requestQuit asks Run to drain and stop; later requests are no-ops.
func (s *Server) requestQuit(reason string) {
	s.quitOnce.Do(func() { s.quit <- reason })
}

// Close releases everything without draining, for a generation that was
// built but never run.
func (s *Server) Close() error {
	s.closeHotRestart()
	s.closeSupervisorLink()
	s.tls.Close()
	s.stopHealthMonitors()
	s.stopXDS()
	s.stopReopen()
	return errors.Join(s.workers.Close(), s.adminLn.Close(), s.closeStats())
}

func bindHint(err error) string {
	if h := workers.BindHint(err); h != "" {
		return " (" + h + ")"
	}
	return ""
}
