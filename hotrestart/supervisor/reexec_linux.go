package supervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
)

// stateVersion is the layout of savedState; a new image refuses another.
const stateVersion = 1

// savedState is what a supervisor hands to its own next image across
// execve, in EnvState. The generations stay its children: execve keeps the
// PID, and with it the parent of every child.
type savedState struct {
	V           int        `json:"v"`
	From        string     `json:"from"` // the version that saved it
	BaseID      int        `json:"base_id"`
	Config      string     `json:"config"`
	Binary      string     `json:"binary"`
	Self        string     `json:"self"`
	ControlFD   int        `json:"control_fd"` // -1: none
	ControlPath string     `json:"control_path"`
	ReplyFD     int        `json:"reply_fd"` // -1: none
	Started     time.Time  `json:"started"`
	Reexecs     int        `json:"reexecs"`
	LastEpoch   int        `json:"last_epoch"`
	Reloads     int        `json:"reloads"`
	Failed      int        `json:"failed"`
	LastFailure *Failure   `json:"last_failure,omitempty"`
	Gens        []savedGen `json:"generations"`
	// Signals arrived before the execve and were not acted on yet: the
	// new image acts on each once.
	Signals  []string    `json:"signals,omitempty"`
	Timeouts savedTiming `json:"timeouts"`
}

type savedGen struct {
	Epoch         int       `json:"epoch"`
	PID           int       `json:"pid"`
	State         State     `json:"state"`
	Started       time.Time `json:"started"`
	ReadyAt       time.Time `json:"ready_at"`
	DrainingSince time.Time `json:"draining_since"`
	Hurried       bool      `json:"hurried,omitempty"`
	Version       string    `json:"version"`
	Binary        string    `json:"binary"`
}

// savedTiming keeps the bounds in force, for a new image that cannot load
// the config any more.
type savedTiming struct {
	Drain, ParentShutdown, CommitWindow, Handoff config.Duration
}

// clearCloexec lets fd survive execve.
func clearCloexec(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0)
	return err
}

// reexec replaces this process's image with the binary at s.self, keeping
// the PID, the children, the control listener and the requester's
// connection. It returns only on failure, which it reports to the
// requester.
func (s *Supervisor) reexec() {
	req := s.reexecReq
	st := savedState{
		V: stateVersion, From: version.Version, BaseID: s.opts.BaseID, Config: s.opts.ConfigPath,
		Binary: s.binary, Self: s.self, ControlFD: -1, ControlPath: s.opts.ControlSocket, ReplyFD: -1,
		Started: s.started, Reexecs: s.reexecs + 1, LastEpoch: s.lastEpoch, Reloads: s.reloads,
		Failed: s.failed, LastFailure: s.lastFailure,
		Timeouts: savedTiming{
			Drain: s.cfg.Server.DrainTime, ParentShutdown: s.cfg.Server.ParentShutdownTime,
			CommitWindow: s.cfg.HotRestart.CommitWindow, Handoff: s.cfg.HotRestart.HandoffTimeout,
		},
	}
	for _, g := range s.gens {
		st.Gens = append(st.Gens, savedGen{
			Epoch: g.epoch, PID: g.pid, State: g.state, Started: g.started, ReadyAt: g.readyAt,
			DrainingSince: g.drainingSince, Version: g.version, Binary: g.binary, Hurried: g.hurried,
		})
	}
	var keep []*os.File
	fail := func(err error) {
		for _, f := range keep {
			f.Close()
		}
		s.log.Error("re-execution failed; this image keeps running", "error", err)
		s.answerReexecFailure(err)
	}
	if s.ctl != nil {
		f, err := s.ctl.ln.File()
		if err != nil {
			fail(fmt.Errorf("control listener: %w", err))
			return
		}
		keep = append(keep, f)
		st.ControlFD = int(f.Fd())
	}
	if req.conn != nil {
		st.ReplyFD = int(req.conn.Fd())
	}
	for _, fd := range []int{st.ControlFD, st.ReplyFD} {
		if fd >= 0 {
			if err := clearCloexec(fd); err != nil {
				fail(fmt.Errorf("fd %d: %w", fd, err))
				return
			}
		}
	}
	// From here to the new image's first instructions, a signal whose
	// handler is this image's would get its default action (SIGHUP and
	// SIGTERM terminate): ignore them instead, and hand over the ones
	// that arrived before. The new image listens again from its package
	// init (earlySignals); one that arrives in between, during the execve
	// itself, is ignored: never fatal.
	unignore, err := ignoreForExec(handedOverSignals)
	if err != nil {
		fail(err)
		return
	}
	restore := func() {
		unignore()
		signal.Notify(s.sigs, supervisedSignals...)
	}
	var pending []os.Signal
	for drained := false; !drained; {
		select {
		case sig := <-s.sigs:
			if sig == unix.SIGCHLD {
				continue // the new image reaps anyway
			}
			pending = append(pending, sig)
			st.Signals = append(st.Signals, unix.SignalName(sig.(unix.Signal)))
		default:
			drained = true
		}
	}
	// A reload deferred while this waited to be idle: the new image runs
	// it, as it acts on a SIGHUP handed over.
	deferredReload := s.machine.takeDeferredReload()
	if deferredReload {
		st.Signals = append(st.Signals, unix.SignalName(unix.SIGHUP))
	}
	blob, err := json.Marshal(st)
	if err != nil {
		restore()
		fail(err)
		for _, sig := range pending {
			s.onSignal(sig)
		}
		if deferredReload {
			s.onSignal(unix.SIGHUP)
		}
		return
	}
	env := []string{EnvState + "=" + string(blob)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvState+"=") {
			env = append(env, kv)
		}
	}
	self := resolve(s.self)
	s.log.Info("re-executing in place", "binary", s.self, "file", self, "version", BinaryVersion(self), "pid", os.Getpid(), "generations", len(s.gens))
	err = syscall.Exec(self, s.opts.Args, env)
	// Still here: execve failed; the fds must not leak into children.
	for _, fd := range []int{st.ReplyFD} {
		if fd >= 0 {
			unix.CloseOnExec(fd)
		}
	}
	restore()
	fail(fmt.Errorf("execve %s: %w", self, err))
	for _, sig := range pending {
		s.onSignal(sig)
	}
	if deferredReload {
		s.onSignal(unix.SIGHUP)
	}
}

// actOnHandedSignals acts once on each signal the previous image handed
// over.
func (s *Supervisor) actOnHandedSignals() {
	for _, name := range s.handedSignals {
		sig := unix.SignalNum(name)
		if sig == 0 {
			s.log.Warn("the previous image handed over an unknown signal", "signal", name)
			continue
		}
		s.log.Info("acting on a signal that arrived during the re-execution", "signal", name)
		s.onSignal(sig)
	}
	s.handedSignals = nil
}

// answerReexecFailure answers the pending reexec request with err.
func (s *Supervisor) answerReexecFailure(err error) {
	req := s.reexecReq
	s.reexecReq = nil
	if req == nil {
		return
	}
	if req.conn != nil {
		writeResponse(req.conn, Response{Error: "reexec: " + err.Error()})
		req.conn.Close()
	} else {
		req.reply <- Response{Error: "reexec: " + err.Error()}
	}
}

// resume rebuilds the state handed over by the previous image, if any.
func (s *Supervisor) resume() (bool, error) {
	blob, ok := os.LookupEnv(EnvState)
	if !ok {
		return false, nil
	}
	os.Unsetenv(EnvState)
	var st savedState
	if err := json.Unmarshal([]byte(blob), &st); err != nil {
		return false, fmt.Errorf("state handed over by the previous image: %w", err)
	}
	if st.V != stateVersion {
		return false, fmt.Errorf("state handed over by the previous image (%s): layout %d, this build reads %d", st.From, st.V, stateVersion)
	}
	s.handedSignals = st.Signals
	s.started, s.reexecs, s.lastEpoch = st.Started, st.Reexecs, st.LastEpoch
	s.reloads, s.failed, s.lastFailure = st.Reloads, st.Failed, st.LastFailure
	s.binary, s.self = st.Binary, st.Self
	if s.opts.Binary != "" && s.opts.Binary != s.self {
		// An explicit generation binary on the command line wins.
		s.binary = s.opts.Binary
	}
	if s.cfg == nil {
		s.cfg = &config.Config{}
		s.cfg.SetDefaults()
	}
	t := st.Timeouts
	s.cfg.Server.DrainTime, s.cfg.Server.ParentShutdownTime = t.Drain, t.ParentShutdown
	s.cfg.HotRestart.CommitWindow, s.cfg.HotRestart.HandoffTimeout = t.CommitWindow, t.Handoff
	for _, g := range st.Gens {
		// Read again rather than carried: they are still this process's
		// unreaped children, so /proc is authoritative.
		startTime, _ := hotrestart.ProcessStartTime(g.PID)
		s.gens = append(s.gens, &generation{
			epoch: g.Epoch, pid: g.PID, state: g.State, started: g.Started, readyAt: g.ReadyAt,
			drainingSince: g.DrainingSince, version: g.Version, binary: g.Binary, hurried: g.Hurried,
			startTime: startTime,
		})
	}
	if st.ControlFD >= 0 {
		unix.CloseOnExec(st.ControlFD)
		ctl, err := controlFromFD(st.ControlFD, st.ControlPath, s.log)
		if err != nil {
			s.log.Error("control socket lost across re-execution; binding it again", "error", err)
		} else {
			s.ctl = ctl
		}
	}
	s.log.Info("resumed after re-execution", "from", st.From, "to", version.Version, "pid", os.Getpid(), "generations", len(s.gens))
	if st.ReplyFD >= 0 {
		unix.CloseOnExec(st.ReplyFD)
		f := os.NewFile(uintptr(st.ReplyFD), "reexec-reply")
		writeResponse(f, Response{OK: true, Status: s.status()})
		f.Close()
	}
	s.notify(statusLine("re-executed in place (" + st.From + " → " + version.Version + "); " + s.summary()))
	return true, nil
}
