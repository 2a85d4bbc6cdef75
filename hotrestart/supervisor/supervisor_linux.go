package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
)

// generation is one child. Owned by the loop goroutine.
type generation struct {
	epoch         int
	pid           int
	state         State
	started       time.Time
	readyAt       time.Time
	drainingSince time.Time
	version       string
	binary        string
	// exitStatus is set once the child was reaped while its readiness
	// line was still awaited.
	exited     bool
	exitStatus string
}

// reloadOp is a reload in progress: the generation it started (nil while
// it waits to start) and who waits for its outcome.
type reloadOp struct {
	gen     *generation
	waiters []chan ReloadResult
	// crash: a cold restart after the serving generation died, not a
	// requested reload.
	crash bool
	// initial: the start of epoch 0; its failure is the supervisor's.
	initial bool
}

// readyMsg is what a generation's readiness pipe said.
type readyMsg struct {
	gen  *generation
	line string
	err  error
}

// ctlReq is a control request handed to the loop.
type ctlReq struct {
	op    string
	reply chan Response
	// conn is the connection of a reexec request; the loop owns it.
	conn *os.File
}

// Supervisor runs generations. Create it with New, run it with Run.
type Supervisor struct {
	opts   Options
	log    hclog.Logger
	notify notifier

	// Fields below are owned by the loop goroutine.
	binary, self string
	cfg          *config.Config
	started      time.Time
	reexecs      int
	gens         []*generation
	lastEpoch    int // the highest epoch started, -1 before the first
	reloads      int
	failed       int
	lastFailure  *Failure
	op           *reloadOp // in progress
	queued       *reloadOp // the one coalesced reload after it
	startAt      time.Time // op waits until then to start (commit window)
	crashes      []time.Time
	stopping     bool
	// quitWhenEmpty: the serving generation drained by itself; stop once
	// the last generation is gone.
	quitWhenEmpty bool
	stopDeadline  time.Time
	killed        bool
	exitErr       error
	reexecReq     *ctlReq

	ctl     *controlServer
	readyCh chan readyMsg
	ctlCh   chan ctlReq
	done    chan struct{}
}

// New checks opts, loads the config once (a config that does not load is
// an error here: fail fast at start) and returns a Supervisor.
func New(opts Options) (*Supervisor, error) {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.ReadyMargin == 0 {
		opts.ReadyMargin = DefaultReadyMargin
	}
	if opts.StopMargin == 0 {
		opts.StopMargin = DefaultStopMargin
	}
	if opts.Args == nil {
		opts.Args = os.Args
	}
	if opts.ControlSocket == "" {
		opts.ControlSocket = DefaultControlSocket(opts.BaseID)
	}
	if opts.NotifySocket == "" {
		opts.NotifySocket = os.Getenv("NOTIFY_SOCKET")
	}
	if opts.ConfigPath != "" {
		abs, err := filepath.Abs(opts.ConfigPath)
		if err != nil {
			return nil, fmt.Errorf("config %s: %w", opts.ConfigPath, err)
		}
		opts.ConfigPath = abs
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this executable's path: %w", err)
	}
	if opts.Binary == "" {
		opts.Binary = exe
	} else if abs, err := filepath.Abs(opts.Binary); err == nil {
		opts.Binary = abs
	}
	if opts.Self == "" {
		opts.Self = exe
	}
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		if _, resuming := os.LookupEnv(EnvState); !resuming {
			return nil, err
		}
		// Re-executing with generations to keep: never give up on them
		// because of the config; the previous image's bounds are used.
		opts.Logger.Warn("config does not load; resuming with the previous bounds", "error", err)
		cfg = nil
	}
	return &Supervisor{
		opts:      opts,
		log:       opts.Logger.Named("supervisor"),
		notify:    notifier{addr: opts.NotifySocket},
		binary:    opts.Binary,
		self:      opts.Self,
		cfg:       cfg,
		lastEpoch: -1,
		readyCh:   make(chan readyMsg, 4),
		ctlCh:     make(chan ctlReq),
		done:      make(chan struct{}),
	}, nil
}

// Run starts epoch 0 (or, after a re-execution in place, resumes the
// generations it was handed) and supervises until SIGTERM or SIGINT has
// stopped every generation, or until nothing is left to run. It returns nil
// after a clean stop and an error saying why otherwise. ctx's cancellation
// is a SIGTERM.
func (s *Supervisor) Run(ctx context.Context) error {
	defer close(s.done)
	if s.opts.ReapOrphans && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			s.log.Warn("cannot become a child subreaper; orphans of generations go to init", "error", err)
		}
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGHUP, unix.SIGTERM, unix.SIGINT, unix.SIGUSR1)
	defer signal.Stop(sigs)

	resumed, err := s.resume()
	if err != nil {
		return err
	}
	if s.opts.ControlSocket != "-" && s.ctl == nil {
		s.ctl, err = listenControl(s.opts.ControlSocket, s.log)
		if err != nil {
			return err
		}
	}
	if s.ctl != nil {
		go s.ctl.serve(s.ctlCh, s.done)
		defer s.ctl.close()
	}
	if !resumed {
		s.started = time.Now()
		s.op = &reloadOp{initial: true}
		coldOK := false
		if s.opts.TakeOver {
			if e, ok := runningEpoch(s.opts.BaseID, s.cfg.HotRestart.SocketDir); ok {
				s.log.Info("taking over from a running generation this supervisor did not start", "epoch", e)
				s.lastEpoch = e
			} else {
				s.log.Info("no running generation to take over from; starting cold")
			}
			coldOK = true
		}
		if err := s.spawn(s.op, coldOK); err != nil {
			return err
		}
	} else {
		s.reap()
	}

	reapTick := time.NewTicker(time.Second)
	defer reapTick.Stop()
	ctxDone := ctx.Done()
	for {
		if s.stopping && s.liveCount() == 0 {
			return s.exitErr
		}
		if s.stopping && !time.Now().Before(s.stopDeadline) {
			if s.killed {
				return errors.Join(s.exitErr, fmt.Errorf("%d generations could not be reaped", s.liveCount()))
			}
			s.killed = true
			s.log.Warn("generations did not stop in time; killing them", "bound", s.stopBound())
			for _, g := range s.gens {
				unix.Kill(g.pid, unix.SIGKILL)
			}
			s.exitErr = errors.Join(s.exitErr, fmt.Errorf("generations did not stop within %s and were killed", s.stopBound()))
			s.stopDeadline = time.Now().Add(s.opts.StopMargin)
		}
		var wake time.Time
		if !s.stopping && s.op != nil && s.op.gen == nil {
			if time.Now().Before(s.startAt) {
				wake = s.startAt
			} else if s.canStart() {
				s.startOp()
				continue
			}
		}
		if s.reexecReq != nil && s.op == nil && !s.stopping {
			s.reexec()
			continue
		}
		if s.stopping && (wake.IsZero() || s.stopDeadline.Before(wake)) {
			wake = s.stopDeadline
		}
		var timer <-chan time.Time
		if !wake.IsZero() {
			timer = time.After(time.Until(wake))
		}
		select {
		case sig := <-sigs:
			switch sig {
			case unix.SIGCHLD:
				s.reap()
			case unix.SIGHUP:
				s.requestReload(nil)
			case unix.SIGUSR1:
				s.forward(unix.SIGUSR1)
			case unix.SIGTERM, unix.SIGINT:
				s.beginStop("signal " + sig.String())
			}
		case <-ctxDone:
			ctxDone = nil
			s.beginStop("context cancelled")
		case m := <-s.readyCh:
			s.onReady(m)
		case r := <-s.ctlCh:
			s.onControl(r)
		case <-timer:
		case <-reapTick.C:
			// Signals coalesce, and one that arrived while re-executing
			// is lost: look anyway, once a second.
			s.reap()
			s.expireDraining()
		}
	}
}

// stopBound is how long a stop may take before the rest is killed.
func (s *Supervisor) stopBound() time.Duration {
	return s.cfg.Server.ParentShutdownTime.D() + s.opts.StopMargin
}

// readyTimeout bounds the wait for a generation's readiness line.
func (s *Supervisor) readyTimeout() time.Duration {
	return s.cfg.HotRestart.HandoffTimeout.D() + s.opts.ReadyMargin
}

func (s *Supervisor) serving() *generation {
	for _, g := range s.gens {
		if g.state == StateServing {
			return g
		}
	}
	return nil
}

func (s *Supervisor) liveCount() int { return len(s.gens) }

// canStart: no half-dead generation (failed, not yet reaped) may still hold
// a restart socket the next one would collide with.
func (s *Supervisor) canStart() bool {
	for _, g := range s.gens {
		if g.state == StateFailed || g.state == StateStarting {
			return false
		}
	}
	return true
}

// requestReload starts a reload, or coalesces it into the queued one.
func (s *Supervisor) requestReload(reply chan ReloadResult) {
	if s.stopping {
		if reply != nil {
			reply <- ReloadResult{Error: ErrStopping.Error(), ServingEpoch: -1}
		}
		return
	}
	if s.op != nil {
		if s.queued == nil {
			s.queued = &reloadOp{}
			s.log.Info("reload requested while one is in progress; it will run after it")
		}
		if reply != nil {
			s.queued.waiters = append(s.queued.waiters, reply)
		}
		return
	}
	op := &reloadOp{}
	if reply != nil {
		op.waiters = append(op.waiters, reply)
	}
	s.beginOp(op)
}

// beginOp makes op the operation in progress. A new generation is started
// only after the serving one has committed (the commit window after its
// readiness, while its parent could still resume): two hand-overs never
// overlap.
func (s *Supervisor) beginOp(op *reloadOp) {
	s.op = op
	s.startAt = time.Time{}
	if g := s.serving(); g != nil && !g.readyAt.IsZero() && s.hasDraining() {
		s.startAt = g.readyAt.Add(s.cfg.HotRestart.CommitWindow.D())
	}
	if !op.crash && !op.initial {
		s.sendNotify("RELOADING=1", "MONOTONIC_USEC="+monotonicUsec(),
			statusLine(fmt.Sprintf("reloading: starting epoch %d", s.nextEpoch())))
	}
}

func (s *Supervisor) hasDraining() bool {
	for _, g := range s.gens {
		if g.state == StateDraining {
			return true
		}
	}
	return false
}

// nextEpoch is the epoch the next generation gets: the serving one's + 1,
// so that a failed epoch is retried with the same number.
func (s *Supervisor) nextEpoch() int {
	if g := s.serving(); g != nil {
		return g.epoch + 1
	}
	return s.lastEpoch + 1
}

// startOp starts the generation of the operation in progress; a failure
// to start it at all finishes the operation.
func (s *Supervisor) startOp() {
	op := s.op
	if cfg, err := config.Load(s.opts.ConfigPath); err != nil {
		// The new generation reads it too, and says what is wrong; a new
		// binary may also know keys this one does not.
		s.log.Warn("config does not load here; starting the generation anyway, it decides", "error", err)
	} else {
		s.cfg = cfg
	}
	if err := s.spawn(op, s.serving() == nil); err != nil {
		s.finishOp(nil, err.Error())
	}
}

// spawn starts a generation for op.
func (s *Supervisor) spawn(op *reloadOp, coldOK bool) error {
	epoch := s.nextEpoch()
	r, w, err := pipe()
	if err != nil {
		return fmt.Errorf("epoch %d: readiness pipe: %w", epoch, err)
	}
	args := []string{s.binary, "serve"}
	if s.opts.ConfigPath != "" {
		args = append(args, "-c", s.opts.ConfigPath)
	}
	args = append(args, "--base-id", strconv.Itoa(s.opts.BaseID), "--restart-epoch", strconv.Itoa(epoch), "--ready-fd", "3")
	if coldOK && epoch > 0 {
		args = append(args, "--allow-cold-start")
	}
	args = append(args, s.opts.ExtraArgs...)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		r.Close()
		w.Close()
		return err
	}
	ver := BinaryVersion(s.binary)
	pid, err := syscall.ForkExec(s.binary, args, &syscall.ProcAttr{
		Env:   s.childEnv(),
		Files: []uintptr{devnull.Fd(), os.Stdout.Fd(), os.Stderr.Fd(), w.Fd()},
	})
	devnull.Close()
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("epoch %d: start %s: %w", epoch, s.binary, err)
	}
	g := &generation{epoch: epoch, pid: pid, state: StateStarting, started: time.Now(), version: ver, binary: s.binary}
	s.gens = append(s.gens, g)
	s.lastEpoch = max(s.lastEpoch, epoch)
	op.gen = g
	s.log.Info("started generation", "epoch", epoch, "pid", pid, "binary", s.binary, "version", ver, "cold_start_allowed", coldOK)
	go readReady(g, r, s.readyTimeout(), s.readyCh, s.done)
	return nil
}

// childEnv is the environment of a generation: this one's, without
// NOTIFY_SOCKET (the supervisor speaks to systemd, not its children) and
// this package's internal variable, plus this supervisor's pid (so that
// the generation hands over only to generations this supervisor starts,
// see hotrestart.FeatureSupervised), plus Options.Env.
func (s *Supervisor) childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NOTIFY_SOCKET=") || strings.HasPrefix(kv, EnvState+"=") ||
			strings.HasPrefix(kv, hotrestart.SupervisorPIDEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, hotrestart.SupervisorPIDEnv+"="+strconv.Itoa(os.Getpid()))
	return append(env, s.opts.Env...)
}

// onReady handles a generation's readiness line (or its absence).
func (s *Supervisor) onReady(m readyMsg) {
	g := m.gen
	if m.err == nil && strings.HasPrefix(m.line, "READY") && !g.exited {
		prev := s.serving()
		g.state = StateServing
		g.readyAt = time.Now()
		if prev != nil {
			prev.state = StateDraining
			prev.drainingSince = g.readyAt
		}
		s.log.Info("generation serves", "epoch", g.epoch, "pid", g.pid)
		s.finishOp(g, "")
		return
	}
	var reason string
	switch {
	case m.err == nil && strings.HasPrefix(m.line, "FAILED"):
		reason = strings.TrimSpace(strings.TrimPrefix(m.line, "FAILED"))
	case m.err == nil && strings.HasPrefix(m.line, "READY"):
		reason = "exited right after it was ready (" + g.exitStatus + ")"
	case errors.Is(m.err, os.ErrDeadlineExceeded):
		reason = fmt.Sprintf("not ready within %s", s.readyTimeout())
	case m.err != nil && g.exited:
		reason = "exited before it was ready (" + g.exitStatus + ")"
	case m.err != nil:
		reason = "closed its readiness pipe without a word"
	default:
		reason = fmt.Sprintf("said %q on its readiness pipe", m.line)
	}
	if reason == "" {
		reason = "failed"
	}
	if !g.exited {
		// It never served: nothing to drain. Kill it; it stays listed as
		// failed until it is reaped.
		g.state = StateFailed
		unix.Kill(g.pid, unix.SIGKILL)
	} else {
		s.remove(g)
	}
	s.log.Error("generation failed to start; the serving generation is untouched", "epoch", g.epoch, "pid", g.pid, "reason", reason)
	s.finishOp(nil, fmt.Sprintf("epoch %d (pid %d): %s", g.epoch, g.pid, reason))
}

// finishOp ends the operation in progress with the generation now serving
// (nil on failure), answers its waiters and promotes the queued one.
func (s *Supervisor) finishOp(g *generation, failure string) {
	op := s.op
	s.op = nil
	epoch := s.lastEpoch
	if op != nil && op.gen != nil {
		epoch = op.gen.epoch
	}
	res := ReloadResult{OK: g != nil, Epoch: epoch, Error: failure, ServingEpoch: -1}
	if g != nil {
		res.PID = g.pid
	}
	if cur := s.serving(); cur != nil {
		res.ServingEpoch, res.ServingPID = cur.epoch, cur.pid
	}
	switch {
	case op != nil && (op.initial || op.crash):
		// Not a reload: counted by neither.
	case g != nil:
		s.reloads++
	default:
		s.failed++
	}
	if g == nil {
		s.lastFailure = &Failure{Epoch: epoch, Reason: failure, At: time.Now()}
		if op != nil && op.gen != nil {
			s.lastFailure.PID = op.gen.pid
		}
	}
	switch {
	case g != nil:
		s.sendNotify("READY=1", statusLine(s.summary()))
	case res.ServingPID != 0:
		s.sendNotify("READY=1", statusLine(fmt.Sprintf("reload to epoch %d failed: %s; %s", epoch, failure, s.summary())))
	default:
		s.sendNotify(statusLine(fmt.Sprintf("epoch %d failed: %s; no generation serves", epoch, failure)))
	}
	if op != nil {
		for _, w := range op.waiters {
			w <- res
		}
	}
	if s.stopping {
		return
	}
	if op != nil && op.initial && g == nil {
		s.exitErr = fmt.Errorf("epoch 0 did not start: %s", failure)
		s.beginStop("epoch 0 did not start")
		return
	}
	if s.queued != nil {
		q := s.queued
		s.queued = nil
		s.beginOp(q)
		return
	}
	if s.serving() == nil {
		// Nothing serves: the service must come back.
		s.crashRestart("no generation serves after: " + failure)
	}
}

// crashRestart schedules a cold start of the next epoch with back-off, or
// gives up after MaxCrashRestarts within CrashWindow.
func (s *Supervisor) crashRestart(why string) {
	now := time.Now()
	kept := s.crashes[:0]
	for _, t := range s.crashes {
		if now.Sub(t) < CrashWindow {
			kept = append(kept, t)
		}
	}
	s.crashes = append(kept, now)
	if len(s.crashes) > MaxCrashRestarts {
		s.exitErr = fmt.Errorf("giving up: %d restarts within %s (%s)", len(s.crashes)-1, CrashWindow, why)
		s.log.Error("the serving generation keeps failing; giving up", "error", s.exitErr)
		s.sendNotify(statusLine(s.exitErr.Error()))
		s.beginStop("giving up")
		return
	}
	backoff := 100 * time.Millisecond << (len(s.crashes) - 1)
	s.log.Warn("no generation serves; starting one cold", "reason", why, "in", backoff)
	op := &reloadOp{crash: true}
	s.beginOp(op)
	s.startAt = now.Add(backoff)
}

// reap collects every child that exited.
func (s *Supervisor) reap() {
	for {
		pid := -1
		if !s.opts.ReapOrphans {
			// Only our own generations, so as not to steal other
			// children of this process (tests that run in process).
			pid = 0
			for _, g := range s.gens {
				var ws unix.WaitStatus
				p, err := unix.Wait4(g.pid, &ws, unix.WNOHANG, nil)
				if err == nil && p == g.pid {
					s.onExit(g, ws)
					pid = p
					break
				}
			}
			if pid == 0 {
				return
			}
			continue
		}
		var ws unix.WaitStatus
		p, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || p <= 0 {
			return
		}
		if g := s.find(p); g != nil {
			s.onExit(g, ws)
		} else {
			s.log.Debug("reaped an orphan", "pid", p, "status", describe(ws))
		}
	}
}

func (s *Supervisor) find(pid int) *generation {
	for _, g := range s.gens {
		if g.pid == pid {
			return g
		}
	}
	return nil
}

func (s *Supervisor) remove(g *generation) {
	for i, x := range s.gens {
		if x == g {
			s.gens = append(s.gens[:i], s.gens[i+1:]...)
			return
		}
	}
}

// describe says how a process ended.
func describe(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}

// onExit handles a generation that was reaped.
func (s *Supervisor) onExit(g *generation, ws unix.WaitStatus) {
	how := describe(ws)
	clean := ws.Exited() && ws.ExitStatus() == 0
	switch g.state {
	case StateStarting:
		// Its readiness reader reports (the pipe closed with it).
		g.exited, g.exitStatus = true, how
		s.log.Debug("starting generation exited", "epoch", g.epoch, "pid", g.pid, "status", how)
		return
	case StateFailed:
		s.log.Debug("failed generation reaped", "epoch", g.epoch, "pid", g.pid, "status", how)
	case StateDraining:
		s.log.Info("drained generation exited", "epoch", g.epoch, "pid", g.pid, "status", how)
	case StateStopping:
		s.log.Info("generation stopped", "epoch", g.epoch, "pid", g.pid, "status", how)
		if !clean && !s.killed {
			s.exitErr = errors.Join(s.exitErr, fmt.Errorf("epoch %d (pid %d) stopped with %s", g.epoch, g.pid, how))
		}
	case StateServing:
		s.remove(g)
		s.onServingDied(g, how, clean)
		return
	}
	s.remove(g)
	if s.quitWhenEmpty && len(s.gens) == 0 && s.op == nil {
		s.beginStop("nothing left to run")
	}
}

// onServingDied: the serving generation exited without being asked. If it
// died within its commit window, its parent resumes serving by itself (the
// contract of serve); otherwise a new generation is started cold.
func (s *Supervisor) onServingDied(g *generation, how string, clean bool) {
	var parent *generation
	for _, d := range s.gens {
		if d.state == StateDraining && d.epoch < g.epoch &&
			time.Since(d.drainingSince) <= s.cfg.HotRestart.CommitWindow.D()+time.Second &&
			(parent == nil || d.epoch > parent.epoch) {
			parent = d
		}
	}
	if clean && parent == nil && s.op == nil {
		// Exit status 0 is a drain this supervisor did not ask for: POST
		// /quitquitquit, or a hand-over to a generation it did not start
		// (another container of the pod, `supervise --take-over`). Not a
		// crash: nothing is restarted, and once nothing is left to run,
		// the supervisor exits 0.
		s.log.Info("the serving generation drained and exited by itself; not restarting it", "epoch", g.epoch, "pid", g.pid)
		s.sendNotify(statusLine(fmt.Sprintf("epoch %d (pid %d) drained and exited by itself; %s", g.epoch, g.pid, s.summary())))
		s.quitWhenEmpty = true
		if len(s.gens) == 0 {
			s.beginStop("nothing left to run")
		}
		return
	}
	reason := fmt.Sprintf("serving generation epoch %d (pid %d) died unexpectedly: %s", g.epoch, g.pid, how)
	s.lastFailure = &Failure{Epoch: g.epoch, PID: g.pid, Reason: reason, At: time.Now()}
	if parent != nil {
		parent.state = StateServing
		parent.drainingSince = time.Time{}
		s.log.Error("rolled back: the previous generation serves again", "reason", reason, "epoch", parent.epoch, "pid", parent.pid)
		s.sendNotify(statusLine(fmt.Sprintf("rolled back: %s; %s", reason, s.summary())))
		return
	}
	s.log.Error(reason)
	if s.op != nil {
		// A reload in progress will find nothing to take over from; its
		// failure leads to a cold start.
		return
	}
	s.crashRestart(reason)
}

// expireDraining kills a draining generation that outlived its bound
// (it should exit by itself within parent_shutdown_time).
func (s *Supervisor) expireDraining() {
	bound := s.cfg.HotRestart.CommitWindow.D() + s.stopBound()
	for _, g := range s.gens {
		if g.state == StateDraining && time.Since(g.drainingSince) > bound {
			s.log.Warn("draining generation outlived parent_shutdown_time; killing it", "epoch", g.epoch, "pid", g.pid)
			unix.Kill(g.pid, unix.SIGKILL)
			g.drainingSince = time.Now() // once per bound
		}
	}
}

// beginStop stops every generation with SIGTERM.
func (s *Supervisor) beginStop(why string) {
	if s.stopping {
		return
	}
	s.stopping = true
	s.stopDeadline = time.Now().Add(s.stopBound())
	s.log.Info("stopping every generation", "why", why, "generations", len(s.gens), "bound", s.stopBound())
	s.sendNotify("STOPPING=1", statusLine("stopping: "+why))
	if s.ctl != nil {
		s.ctl.close()
	}
	for _, op := range []*reloadOp{s.op, s.queued} {
		if op == nil {
			continue
		}
		for _, w := range op.waiters {
			w <- ReloadResult{Error: ErrStopping.Error(), ServingEpoch: -1}
		}
		op.waiters = nil
	}
	s.queued = nil
	if s.op != nil && s.op.gen == nil {
		s.op = nil
	}
	if s.reexecReq != nil {
		s.answerReexecFailure(ErrStopping)
	}
	for _, g := range s.gens {
		if g.state != StateFailed {
			g.state = StateStopping
		}
		unix.Kill(g.pid, unix.SIGTERM)
	}
}

// forward sends sig to every generation.
func (s *Supervisor) forward(sig unix.Signal) {
	for _, g := range s.gens {
		unix.Kill(g.pid, sig)
	}
	s.log.Info("forwarded signal", "signal", sig.String(), "generations", len(s.gens))
}

// summary names the serving and draining generations.
func (s *Supervisor) summary() string {
	var parts []string
	for _, g := range s.gens {
		if g.state == StateServing {
			parts = append(parts, fmt.Sprintf("epoch %d serving (pid %d)", g.epoch, g.pid))
		}
	}
	for _, g := range s.gens {
		if g.state == StateDraining {
			parts = append(parts, fmt.Sprintf("epoch %d draining (pid %d)", g.epoch, g.pid))
		}
	}
	if len(parts) == 0 {
		return "no generation serves"
	}
	return strings.Join(parts, ", ")
}

func (s *Supervisor) sendNotify(lines ...string) {
	if err := s.notify.send(lines...); err != nil {
		s.log.Warn("systemd notification failed", "error", err)
	}
}

// status builds a Status.
func (s *Supervisor) status() *Status {
	st := &Status{
		PID: os.Getpid(), Version: version.Version, Started: s.started, BaseID: s.opts.BaseID,
		Config: s.opts.ConfigPath, Binary: s.binary, Reexecs: s.reexecs, ServingEpoch: -1,
		Reloads: s.reloads, FailedReloads: s.failed, LastFailure: s.lastFailure, Stopping: s.stopping,
		Generations: []GenerationStatus{},
	}
	if st.Config == "" {
		st.Config = config.DefaultSource
	}
	if s.ctl != nil {
		st.RefusedControlPeers = s.ctl.refused()
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
		s.requestReload(res)
		go func() {
			rr := <-res
			r.reply <- Response{OK: rr.OK, Error: rr.Error, Reload: &rr}
		}()
	case OpReexec:
		if s.reexecReq != nil || s.stopping {
			resp := Response{Error: "reexec: a re-execution is already pending"}
			if s.stopping {
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

// pipe makes the readiness pipe: a non-blocking read end (so that it has
// deadlines) and a blocking write end for the child.
func pipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "ready-r"), os.NewFile(uintptr(p[1]), "ready-w"), nil
}

// readReady reads one line from a generation's readiness pipe, within
// timeout, and hands it to the loop.
func readReady(g *generation, r *os.File, timeout time.Duration, out chan<- readyMsg, done <-chan struct{}) {
	defer r.Close()
	send := func(m readyMsg) {
		select {
		case out <- m:
		case <-done:
		}
	}
	r.SetReadDeadline(time.Now().Add(timeout))
	var buf []byte
	tmp := make([]byte, 512)
	for {
		n, err := r.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if i := strings.IndexByte(string(buf), '\n'); i >= 0 {
			send(readyMsg{gen: g, line: strings.TrimSpace(string(buf[:i]))})
			return
		}
		if len(buf) > 4096 {
			send(readyMsg{gen: g, line: strings.TrimSpace(string(buf[:4096]))})
			return
		}
		if err != nil {
			if len(buf) > 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
				send(readyMsg{gen: g, line: strings.TrimSpace(string(buf))})
				return
			}
			send(readyMsg{gen: g, err: err})
			return
		}
	}
}
