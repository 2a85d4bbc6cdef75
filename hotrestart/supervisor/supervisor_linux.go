package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/internal/timerslack"
)

// The Linux process layer under the machine (machine.go): fork-exec,
// signals, wait4, the readiness pipes, the systemd notifications, the
// control socket and the re-execution in place.

// ctlReq is a control request handed to the loop.
type ctlReq struct {
	op         string
	waitCommit bool
	reply      chan Response
	// conn is the connection of a reexec request; the loop owns it.
	conn *os.File
}

// Supervisor runs generations. Create it with New, run it with Run.
type Supervisor struct {
	*machine // owned by the loop goroutine, as are the fields below

	opts     Options
	log      hclog.Logger
	notifier notifier

	binary, self string
	started      time.Time
	reexecs      int
	reexecReq    *ctlReq

	ctl  *controlServer
	sigs chan os.Signal // what signal.Notify delivers to
	// handedSignals are signals the previous image received but had not
	// acted on when it re-executed; resume acts on them.
	handedSignals []string
	readyCh       chan readyMsg
	ctlCh         chan ctlReq
	// The kept listening sockets (keeper_linux.go): the serving
	// generation's set, and sets sent by generations still starting.
	kept          *keptSet
	pendingKept   map[*generation]*keptSet
	keepCh        chan keepMsg
	keptReqCh     chan keptReq
	watchFailures ratelog.Limiter
	// exited is closed when Run returns.
	exited chan struct{}
}

var _ processTable = (*Supervisor)(nil)

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
	exe, err := invokedPath()
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
	s := &Supervisor{
		opts:     opts,
		log:      opts.Logger.Named("supervisor"),
		notifier: notifier{addr: opts.NotifySocket},
		binary:   opts.Binary,
		self:     opts.Self,
		readyCh:  make(chan readyMsg, 4),
		ctlCh:    make(chan ctlReq),
		exited:   make(chan struct{}),

		pendingKept: map[*generation]*keptSet{},
		keepCh:      make(chan keepMsg),
		keptReqCh:   make(chan keptReq),
	}
	s.watchFailures.Log = s.log
	s.machine = newMachine(s, cfg, s.log)
	s.machine.loadConfig = func() (*config.Config, error) { return config.Load(opts.ConfigPath) }
	s.machine.readyMargin, s.machine.stopMargin = opts.ReadyMargin, opts.StopMargin
	s.machine.keptSockets = s.haveKept
	s.machine.dropKept = s.dropKeptSockets
	return s, nil
}

// Run starts epoch 0 (or, after a re-execution in place, resumes the
// generations it was handed) and supervises until SIGTERM or SIGINT has
// stopped every generation, or until nothing is left to run. It returns nil
// after a clean stop and an error saying why otherwise. ctx's cancellation
// is a SIGTERM.
func (s *Supervisor) Run(ctx context.Context) error {
	defer close(s.exited)
	defer func() {
		s.dropKept("the supervisor exits")
		for g, set := range s.pendingKept {
			set.close()
			delete(s.pendingKept, g)
		}
	}()
	if s.opts.ReapOrphans && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			s.log.Warn("cannot become a child subreaper; orphans of generations go to init", "error", err)
		}
	}
	sigs := earlySignals
	if sigs == nil {
		sigs = make(chan os.Signal, signalQueue)
		signal.Notify(sigs, supervisedSignals...)
	}
	s.sigs = sigs
	defer signal.Stop(sigs)
	if s.opts.WatchConfig > 0 && s.opts.ConfigPath != "" {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		w := &configWatcher{path: s.opts.ConfigPath, interval: max(s.opts.WatchConfig, MinWatchConfig), log: s.log}
		// Into the signal channel: a change is a SIGHUP, handled by the
		// same code (coalesced the same way too).
		go w.run(watchCtx, func() {
			select {
			case sigs <- unix.SIGHUP:
			case <-watchCtx.Done():
			}
		})
	}

	resumed, err := s.resume()
	if err != nil {
		return err
	}
	switch {
	case s.ctl != nil, s.opts.ControlSocket == "-":
	case s.opts.ControlSocket == "":
		if s.ctl, err = listenDefaultControl(s.opts.BaseID, s.log); err != nil {
			return err
		}
		// A re-execution in place hands over this path, not the search.
		s.opts.ControlSocket = s.ctl.path
	default:
		if s.ctl, err = listenControl(s.opts.ControlSocket, s.log); err != nil {
			return err
		}
	}
	if s.ctl != nil {
		go s.ctl.serve(s.ctlCh, s.exited)
		defer s.ctl.close()
	}
	if !resumed {
		s.started = time.Now()
		s.op = &reloadOp{initial: true}
		coldOK := false
		if s.opts.TakeOver {
			if e, ok := runningEpoch(s.opts.BaseID, s.cfg.HotRestart.SocketDir, s.log); ok {
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
		s.actOnHandedSignals()
	}

	reapTick := time.NewTicker(time.Second)
	defer reapTick.Stop()
	watchEvery := s.watchInterval()
	watchTick := time.NewTicker(watchEvery)
	defer watchTick.Stop()
	ctxDone := ctx.Done()
	for {
		s.syncKept()
		if w := s.watchInterval(); w != watchEvery {
			watchEvery = w
			watchTick.Reset(w)
		}
		if done, err := s.machine.done(); done {
			return err
		}
		s.machine.deferReloads(s.reexecReq != nil)
		wake, err := s.tick()
		if err != nil {
			return err
		}
		if s.reexecReq != nil && s.idle() {
			s.reexec()
			continue
		}
		var timer <-chan time.Time
		if !wake.IsZero() {
			timer = time.After(time.Until(wake))
		}
		select {
		case sig := <-sigs:
			s.onSignal(sig)
		case <-ctxDone:
			ctxDone = nil
			s.beginStop("context cancelled")
		case m := <-s.readyCh:
			if m.err != nil {
				// The pipe closed because the generation died (readReady
				// waited for that): reap it first, so that the failure
				// says how it ended rather than "without a word".
				s.reap()
			}
			s.onReady(m)
		case r := <-s.ctlCh:
			s.onControl(r)
		case k := <-s.keepCh:
			s.onKeep(k)
		case r := <-s.keptReqCh:
			s.onKeptReq(r)
		case <-watchTick.C:
			s.watchHeartbeat()
		case <-timer:
		case <-reapTick.C:
			// Signals coalesce, and one that arrived while re-executing
			// is lost: look anyway, once a second.
			s.reap()
			s.expireDraining()
		}
	}
}

// onSignal acts on a signal the supervisor received.
func (s *Supervisor) onSignal(sig os.Signal) {
	switch sig {
	case unix.SIGCHLD:
		s.reap()
	case unix.SIGHUP:
		s.requestReload(nil, false)
	case unix.SIGUSR1:
		if s.opts.LogFile != nil {
			if err := s.opts.LogFile.Reopen(); err != nil {
				s.log.Error("SIGUSR1: cannot reopen the process log; still writing to the old file", "error", err)
			} else {
				s.log.Info("SIGUSR1: process log reopened")
			}
		}
		s.forward(SignalUser1)
	case unix.SIGUSR2:
		// The generations re-read their TLS certificates; for the
		// supervisor itself, SIGUSR2's default action would end it.
		s.forward(SignalUser2)
	case unix.SIGTERM, unix.SIGINT:
		s.beginStop("signal " + sig.String())
	}
}

// invokedPath is the path this process was started by, made absolute but
// not resolved: a symlink in it (a deploy tool's `current`) is resolved
// afresh at each start and re-execution, so flipping it takes effect on
// the next reload. os.Executable would name the file it pointed to then.
func invokedPath() (string, error) {
	arg0 := os.Args[0]
	if !strings.Contains(arg0, "/") {
		p, err := exec.LookPath(arg0)
		if err != nil {
			return os.Executable()
		}
		arg0 = p
	}
	return filepath.Abs(arg0)
}

// resolve follows the symlinks in path now: the file an exec of path would
// run, so that the version read and the file run are the same even if a
// symlink flips meanwhile.
func resolve(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

// start is processTable.start: fork-exec `serve` with a readiness pipe on
// fd 3, and a goroutine that reads it.
func (s *Supervisor) start(g *generation, coldOK bool) error {
	binary := resolve(s.binary)
	if g.parent != parentKept {
		// Fresh sockets of the new generation would join the
		// SO_REUSEPORT groups of kept ones nobody accepts on.
		s.dropKept("the new generation starts on sockets of its own")
	}
	r, w, err := pipe()
	if err != nil {
		return fmt.Errorf("epoch %d: readiness pipe: %w", g.epoch, err)
	}
	linkConn, linkFile, err := s.newLink()
	if err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("epoch %d: %w", g.epoch, err)
	}
	args := []string{s.binary, "serve"} // argv[0] as configured: a reload re-resolves it
	if s.opts.ConfigPath != "" {
		args = append(args, "-c", s.opts.ConfigPath)
	}
	args = append(args, "--base-id", strconv.Itoa(s.opts.BaseID), "--restart-epoch", strconv.Itoa(g.epoch), "--ready-fd", "3",
		"--supervisor-fd", strconv.Itoa(generationLinkFD))
	if coldOK && g.epoch > 0 {
		args = append(args, "--allow-cold-start")
	}
	if g.epoch > 0 {
		switch g.parent {
		case parentGeneration:
			args = append(args, "--restart-parent", fmt.Sprintf("%d:%d", g.parentPID, g.parentStartTime))
		case parentNone:
			args = append(args, "--restart-parent", "none")
		case parentKept:
			args = append(args, "--restart-parent", "kept")
		}
	}
	args = append(args, s.opts.ExtraArgs...)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		r.Close()
		w.Close()
		linkConn.Close()
		linkFile.Close()
		return err
	}
	ver := BinaryVersion(binary)
	// Started with server.timer_slack already on its first thread, the
	// generation's threads all inherit it: setting it itself on threads
	// other than its own would need CAP_SYS_NICE.
	var slack time.Duration
	if s.cfg != nil {
		slack = s.cfg.Server.TimerSlack.D()
	}
	pid, err := timerslack.ForkExec(slack, binary, args, &syscall.ProcAttr{
		Env:   s.childEnv(),
		Files: []uintptr{devnull.Fd(), os.Stdout.Fd(), os.Stderr.Fd(), w.Fd(), linkFile.Fd()},
	})
	devnull.Close()
	w.Close()
	linkFile.Close()
	if err != nil {
		r.Close()
		linkConn.Close()
		return fmt.Errorf("epoch %d: start %s: %w", g.epoch, binary, err)
	}
	go s.serveLink(g, g.epoch, pid, linkConn, s.keepEnabled(), s.readyTimeout())
	g.pid, g.version, g.binary = pid, ver, binary
	// Read now, while it is this process's unreaped child: the pid cannot
	// be anyone else's yet. Its successor is told pid and start time.
	if g.startTime, err = hotrestart.ProcessStartTime(pid); err != nil {
		s.log.Warn("cannot read the start time of a generation; its successor will check its pid only", "epoch", g.epoch, "pid", pid, "error", err)
	}
	go readReady(g, r, s.readyTimeout(), s.readyCh, s.exited)
	return nil
}

// signal is processTable.signal.
func (s *Supervisor) signal(g *generation, sig Signal) {
	unixSig := map[Signal]unix.Signal{SignalTerm: unix.SIGTERM, SignalKill: unix.SIGKILL, SignalUser1: unix.SIGUSR1, SignalUser2: unix.SIGUSR2}[sig]
	unix.Kill(g.pid, unixSig)
}

// notify is processTable.notify.
func (s *Supervisor) notify(lines ...string) {
	if len(lines) > 0 && lines[0] == "RELOADING=1" {
		lines = append([]string{lines[0], "MONOTONIC_USEC=" + monotonicUsec()}, lines[1:]...)
	}
	if err := s.notifier.send(lines...); err != nil {
		s.log.Warn("systemd notification failed", "error", err)
	}
}

// stopping is processTable.stopping: no more control requests, and a
// pending re-execution will not happen.
func (s *Supervisor) stopping() {
	if s.ctl != nil {
		s.ctl.close()
	}
	if s.reexecReq != nil {
		s.answerReexecFailure(ErrStopping)
	}
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

// reap collects every child that exited.
func (s *Supervisor) reap() {
	for {
		if !s.opts.ReapOrphans {
			// Only our own generations, so as not to steal other
			// children of this process (tests that run in process).
			reaped := false
			for _, g := range s.gens {
				var ws unix.WaitStatus
				p, err := unix.Wait4(g.pid, &ws, unix.WNOHANG, nil)
				if err == nil && p == g.pid {
					s.onExit(g, exitOf(ws))
					reaped = true
					break
				}
			}
			if !reaped {
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
			s.onExit(g, exitOf(ws))
		} else {
			s.log.Debug("reaped an orphan", "pid", p, "status", exitOf(ws).how)
		}
	}
}

// exitOf says how a process ended.
func exitOf(ws unix.WaitStatus) exit {
	switch {
	case ws.Exited():
		return exit{how: "exit status " + strconv.Itoa(ws.ExitStatus()), clean: ws.ExitStatus() == 0}
	case ws.Signaled():
		// "killed by SIGKILL": Signal.String would say "killed by killed".
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = "signal " + strconv.Itoa(int(ws.Signal()))
		}
		if ws.CoreDump() {
			name += " (core dumped)"
		}
		return exit{how: "killed by " + name}
	}
	return exit{how: fmt.Sprintf("wait status %#x", uint32(ws))}
}
