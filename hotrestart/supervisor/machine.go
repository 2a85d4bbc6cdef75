package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
)

// The supervisor's decisions — which epoch to start and when, what a
// readiness line or an exit means, coalescing, crash back-off, rollback
// detection, the bounds of a stop — are made here, by a machine that owns
// the generations and touches the operating system only through
// processTable. The Linux layer (supervisor_linux.go) starts, signals and
// reaps real processes and feeds the machine their readiness and exits;
// the tests (machine_test.go) feed it a fake table and a fake clock.

// processTable is what the machine asks of the operating system.
type processTable interface {
	// start starts g (its epoch is set) and fills in its pid, binary and
	// version. Its readiness line reaches the machine later, through
	// onReady; a generation that cannot be started at all is an error.
	start(g *generation, coldOK bool) error
	// signal sends sig to g's process.
	signal(g *generation, sig Signal)
	// notify sends a systemd notification (lines of "KEY=value"); the
	// table adds MONOTONIC_USEC= to a RELOADING=1, as systemd wants.
	notify(lines ...string)
	// stopping is told that the supervisor stops: requests that cannot
	// be honoured any more (a pending re-execution) are answered.
	stopping()
}

// Signal is a signal the machine sends to a generation.
type Signal int

const (
	SignalTerm  Signal = iota // drain and stop
	SignalKill                // stop now
	SignalUser1               // forwarded SIGUSR1: reopen logs
	SignalUser2               // forwarded SIGUSR2: re-read the TLS certificates
)

func (s Signal) String() string {
	switch s {
	case SignalTerm:
		return "SIGTERM"
	case SignalKill:
		return "SIGKILL"
	case SignalUser1:
		return "SIGUSR1"
	case SignalUser2:
		return "SIGUSR2"
	}
	return fmt.Sprintf("Signal(%d)", int(s))
}

// generation is one child. Owned by the machine.
type generation struct {
	epoch         int
	pid           int
	state         State
	started       time.Time
	readyAt       time.Time
	drainingSince time.Time
	version       string
	binary        string
	// startTime is the process's start time (hotrestart.ProcessStartTime),
	// read by the process table while the child is its own and unreaped:
	// with pid, it names this process for good.
	startTime uint64
	// parent is whom this generation is told to take over from (see
	// parentKind); parentPID and parentStartTime name it when it is one of
	// this supervisor's generations.
	parent          parentKind
	parentPID       int
	parentStartTime uint64
	// commitWaiters wait for this generation to outlive its commit
	// window (or to be superseded by a newer one) as the serving one.
	commitWaiters []chan ReloadResult
	// hurried: told to stop (SIGTERM) because too many generations
	// drained; it can no longer be rolled back to.
	hurried bool
	// hurriedAt is when it was hurried (for what a waiting reload says).
	hurriedAt time.Time
	// countedReload: it was counted in machine.reloads when it served;
	// a rollback moves it to machine.failed.
	countedReload bool
	// exitStatus is set once the child was reaped while its readiness
	// line was still awaited.
	exited     bool
	exitStatus string
	// held are the signals forwarded while it was starting, sent once it
	// is ready (each at most once): before its handlers are installed,
	// SIGUSR1's default action would kill it, and the reload that started
	// it would fail because a log was rotated.
	held []Signal
}

// parentKind is what the supervisor tells a new generation of the one it
// takes over from, from its own process table — never from what listens
// at a restart socket, which any local user may have bound first.
type parentKind int

const (
	// parentNone: nothing serves (it crashed, or this is epoch 0): start
	// cold and dial nothing.
	parentNone parentKind = iota
	// parentGeneration: the serving generation, by pid and start time.
	parentGeneration
	// parentAny: a generation this supervisor did not start (TakeOver:
	// another container's, whose pid this one may not see): any process
	// of this user or root.
	parentAny
	// parentKept: the serving generation died or wedged, and this
	// supervisor kept its listening sockets: the new one takes them over
	// the supervisor's link, dialing nothing.
	parentKept
)

// exit is how a reaped generation ended.
type exit struct {
	how   string // "exit status 3", "killed by SIGKILL"
	clean bool   // exit status 0
}

// reloadOp is a reload in progress: the generation it started (nil while
// it waits to start) and who waits for its outcome.
type reloadOp struct {
	gen     *generation
	waiters []reloadWaiter
	// crash: a cold restart after the serving generation died, not a
	// requested reload.
	crash bool
	// initial: the start of epoch 0; its failure is the supervisor's.
	initial bool
}

// reloadWaiter is who waits for a reload's outcome: once the generation
// serves, or (commit) once it has also outlived its commit window.
type reloadWaiter struct {
	reply  chan ReloadResult
	commit bool
}

// readyMsg is what a generation's readiness pipe said.
type readyMsg struct {
	gen  *generation
	line string
	err  error
}

// machine is the supervisor's state. One goroutine owns it.
type machine struct {
	procs processTable
	log   hclog.Logger
	now   func() time.Time
	// loadConfig reads the config afresh before each start (its bounds
	// apply to the generation started).
	loadConfig func() (*config.Config, error)
	// readyMargin and stopMargin: see Options.
	readyMargin, stopMargin time.Duration
	// keptSockets reports whether the process table keeps listening
	// sockets of a generation that served (hot_restart.keep_listeners):
	// a generation started while none serves takes those.
	keptSockets func() bool
	// dropKept lets go of the kept sockets: a generation started on them
	// failed, and the next one starts cold (a binary that cannot take
	// them must not fail forever).
	dropKept func(why string)

	cfg         *config.Config
	gens        []*generation
	lastEpoch   int // the highest epoch started, -1 before the first
	reloads     int
	failed      int
	lastFailure *Failure
	op          *reloadOp // in progress
	queued      *reloadOp // the one coalesced reload after it
	// reloadsDeferred: a re-execution waits for the machine to be idle,
	// so a reload nobody waits on (a signal's, the config watcher's) is
	// queued rather than started, and handed to the new image; without
	// that, a steady stream of SIGHUP never leaves the machine idle and
	// the re-execution waits for ever (seen: 2 min under a SIGHUP flood).
	reloadsDeferred bool
	startAt         time.Time // op waits until then to start (commit window, back-off)
	crashes         []time.Time
	stopping        bool
	quitWhenEmpty   bool // the serving generation drained by itself: stop once nothing is left
	stopDeadline    time.Time
	killed          bool
	exitErr         error
}

func newMachine(procs processTable, cfg *config.Config, log hclog.Logger) *machine {
	return &machine{procs: procs, cfg: cfg, log: log, now: time.Now, lastEpoch: -1,
		loadConfig:  func() (*config.Config, error) { return cfg, nil },
		keptSockets: func() bool { return false },
		dropKept:    func(string) {},
		readyMargin: DefaultReadyMargin, stopMargin: DefaultStopMargin}
}

// stopBound is how long a stop may take before the rest is killed.
func (m *machine) stopBound() time.Duration {
	return m.cfg.Server.ParentShutdownTime.D() + m.stopMargin
}

// readyTimeout bounds the wait for a generation's readiness line: the
// hand-over's bound, or with [xds] the initial fetch's if longer (a
// generation that starts cold waits up to initial_fetch_timeout for the
// control plane's first warm set before it reports ready).
func (m *machine) readyTimeout() time.Duration {
	d := m.cfg.HotRestart.HandoffTimeout.D()
	if m.cfg.XDS.Cluster != "" {
		d = max(d, m.cfg.XDS.InitialFetchTimeout.D())
	}
	return d + m.readyMargin
}

func (m *machine) serving() *generation {
	for _, g := range m.gens {
		if g.state == StateServing {
			return g
		}
	}
	return nil
}

func (m *machine) find(pid int) *generation {
	for _, g := range m.gens {
		if g.pid == pid {
			return g
		}
	}
	return nil
}

func (m *machine) remove(g *generation) {
	for i, x := range m.gens {
		if x == g {
			m.gens = append(m.gens[:i], m.gens[i+1:]...)
			return
		}
	}
}

// done reports whether the supervisor has nothing left to do, and its
// outcome.
func (m *machine) done() (bool, error) {
	return m.stopping && len(m.gens) == 0, m.exitErr
}

// tick does what is due at now and returns when it wants to be called
// next (zero: no time-driven work). The loop also calls it after every
// event.
func (m *machine) tick() (wake time.Time, err error) {
	now := m.now()
	if m.stopping && !now.Before(m.stopDeadline) {
		if m.killed {
			return time.Time{}, errors.Join(m.exitErr, fmt.Errorf("%d generations could not be reaped", len(m.gens)))
		}
		m.killed = true
		m.log.Warn("generations did not stop in time; killing them", "bound", m.stopBound())
		for _, g := range m.gens {
			m.procs.signal(g, SignalKill)
		}
		m.exitErr = errors.Join(m.exitErr, fmt.Errorf("generations did not stop within %s and were killed", m.stopBound()))
		m.stopDeadline = now.Add(m.stopMargin)
	}
	for !m.stopping && m.op != nil && m.op.gen == nil {
		if now.Before(m.startAt) {
			wake = m.startAt
			break
		}
		if !m.canStart() || !m.roomToStart() {
			break
		}
		m.startOp()
	}
	if w := m.answerCommitted(); !w.IsZero() && (wake.IsZero() || w.Before(wake)) {
		wake = w
	}
	if m.stopping && (wake.IsZero() || m.stopDeadline.Before(wake)) {
		wake = m.stopDeadline
	}
	return wake, nil
}

// canStart: no half-dead generation (failed, not yet reaped) may still hold
// a restart socket the next one would collide with.
func (m *machine) canStart() bool {
	for _, g := range m.gens {
		if g.state == StateFailed || g.state == StateStarting {
			return false
		}
	}
	return true
}

// idle: no reload in progress or waited for (a re-execution may proceed).
func (m *machine) idle() bool {
	if m.op != nil || m.stopping {
		return false
	}
	for _, g := range m.gens {
		if len(g.commitWaiters) > 0 {
			return false
		}
	}
	return true
}

// requestReload starts a reload, or coalesces it into the queued one. The
// outcome goes to reply (nil: nobody waits) once the new generation serves,
// or with waitCommit once it has outlived its commit window: what a
// service manager needs to report a rolled-back reload as failed.
func (m *machine) requestReload(reply chan ReloadResult, waitCommit bool) {
	if m.stopping {
		if reply != nil {
			reply <- ReloadResult{Error: ErrStopping.Error(), ServingEpoch: -1}
		}
		return
	}
	if m.op != nil || (reply == nil && m.reloadsDeferred) {
		if m.queued == nil {
			m.queued = &reloadOp{}
			if m.op != nil {
				m.log.Info("reload requested while one is in progress; it will run after it")
			} else {
				m.log.Info("reload requested while the supervisor waits to re-execute; the new image runs it")
			}
		}
		if reply != nil {
			m.queued.waiters = append(m.queued.waiters, reloadWaiter{reply, waitCommit})
		}
		return
	}
	op := &reloadOp{}
	if reply != nil {
		op.waiters = append(op.waiters, reloadWaiter{reply, waitCommit})
	}
	m.beginOp(op)
}

// deferReloads says whether a re-execution is pending (see
// reloadsDeferred). When it no longer is (it failed), a reload deferred
// meanwhile starts.
func (m *machine) deferReloads(pending bool) {
	m.reloadsDeferred = pending
	if !pending && m.op == nil && m.queued != nil && !m.stopping {
		q := m.queued
		m.queued = nil
		m.beginOp(q)
	}
}

// takeDeferredReload returns whether a reload nobody waits on was
// deferred for the re-execution, and forgets it: the new image runs it.
func (m *machine) takeDeferredReload() bool {
	if m.op != nil || m.queued == nil || len(m.queued.waiters) > 0 {
		return false
	}
	m.queued = nil
	return true
}

// beginOp makes op the operation in progress; its generation starts at
// once (tick), even while the serving one is still in its commit window:
// that one commits its own parent early when it hands over in turn, and
// the new one becomes the rollback target.
func (m *machine) beginOp(op *reloadOp) {
	m.op = op
	m.startAt = time.Time{}
	if !op.crash && !op.initial {
		m.procs.notify("RELOADING=1",
			statusLine(fmt.Sprintf("reloading: starting epoch %d", m.nextEpoch())))
	}
}

// nextEpoch is the epoch the next generation gets: the serving one's + 1,
// so that a failed epoch is retried with the same number.
func (m *machine) nextEpoch() int {
	if g := m.serving(); g != nil {
		return g.epoch + 1
	}
	return m.lastEpoch + 1
}

// startOp starts the generation of the operation in progress; a failure
// to start it at all finishes the operation.
func (m *machine) startOp() {
	if cfg, err := m.loadConfig(); err != nil {
		// The new generation reads it too, and says what is wrong; a new
		// binary may also know keys this one does not.
		m.log.Warn("config does not load here; starting the generation anyway, it decides", "error", err)
	} else {
		m.cfg = cfg
	}
	if err := m.spawn(m.op, m.serving() == nil); err != nil {
		m.finishOp(nil, err.Error())
	}
}

// spawn starts a generation for op.
func (m *machine) spawn(op *reloadOp, coldOK bool) error {
	g := &generation{epoch: m.nextEpoch(), state: StateStarting, started: m.now()}
	switch p := m.serving(); {
	case p != nil:
		g.parent, g.parentPID, g.parentStartTime = parentGeneration, p.pid, p.startTime
	case op.initial && g.epoch > 0:
		// Only a take-over starts past epoch 0 (runningEpoch found one).
		g.parent = parentAny
	case !op.initial && m.keptSockets():
		// The serving one died or wedged: its queued connections wait
		// in the sockets kept.
		g.parent = parentKept
	}
	if err := m.procs.start(g, coldOK); err != nil {
		return err
	}
	m.gens = append(m.gens, g)
	m.lastEpoch = max(m.lastEpoch, g.epoch)
	op.gen = g
	m.log.Info("started generation", "epoch", g.epoch, "pid", g.pid, "binary", g.binary, "version", g.version, "cold_start_allowed", coldOK)
	return nil
}

// summary names the serving and draining generations.
func (m *machine) summary() string {
	var parts []string
	for _, g := range m.gens {
		if g.state == StateServing {
			parts = append(parts, fmt.Sprintf("epoch %d serving (pid %d)", g.epoch, g.pid))
		}
	}
	for _, g := range m.gens {
		if g.state == StateDraining {
			parts = append(parts, fmt.Sprintf("epoch %d draining (pid %d)", g.epoch, g.pid))
		}
	}
	for _, g := range m.gens {
		if g.state == StateWedged {
			parts = append(parts, fmt.Sprintf("epoch %d wedged (pid %d)", g.epoch, g.pid))
		}
	}
	if len(parts) == 0 {
		return "no generation serves"
	}
	return strings.Join(parts, ", ")
}

// beginStop stops every generation with SIGTERM.
func (m *machine) beginStop(why string) {
	if m.stopping {
		return
	}
	m.stopping = true
	m.stopDeadline = m.now().Add(m.stopBound())
	m.log.Info("stopping every generation", "why", why, "generations", len(m.gens), "bound", m.stopBound())
	m.procs.notify("STOPPING=1", statusLine("stopping: "+why))
	for _, op := range []*reloadOp{m.op, m.queued} {
		if op == nil {
			continue
		}
		for _, w := range op.waiters {
			w.reply <- ReloadResult{Error: ErrStopping.Error(), ServingEpoch: -1}
		}
		op.waiters = nil
	}
	for _, g := range m.gens {
		m.answerCommitWaiters(g, ReloadResult{Error: ErrStopping.Error(), Epoch: g.epoch, PID: g.pid, ServingEpoch: -1})
	}
	m.queued = nil
	if m.op != nil && m.op.gen == nil {
		m.op = nil
	}
	m.procs.stopping()
	for _, g := range m.gens {
		if g.state != StateFailed {
			g.state = StateStopping
		}
		m.procs.signal(g, SignalTerm)
	}
}

// forward sends sig to every generation; one still starting gets it once
// it is ready (releaseHeld).
func (m *machine) forward(sig Signal) {
	held := 0
	for _, g := range m.gens {
		if g.state == StateStarting {
			if !slices.Contains(g.held, sig) {
				g.held = append(g.held, sig)
			}
			held++
			continue
		}
		m.procs.signal(g, sig)
	}
	m.log.Info("forwarded signal", "signal", sig.String(), "generations", len(m.gens)-held, "held_until_ready", held)
}

// releaseHeld sends a generation that has just become ready the signals
// forwarded while it started.
func (m *machine) releaseHeld(g *generation) {
	for _, sig := range g.held {
		m.procs.signal(g, sig)
		m.log.Info("forwarded a signal held until the generation was ready", "signal", sig.String(), "epoch", g.epoch, "pid", g.pid)
	}
	g.held = nil
}

// statusLine makes a STATUS= line of s, on one line.
func statusLine(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}
