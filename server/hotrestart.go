package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
	"github.com/hotproxy/hotproxy/workers"
)

// A generation takes part in hot restart twice: as the child that takes
// over from the generation before it (New, then Run tells that one to
// drain), and as the parent that hands over to the one after it. The
// restart socket's sessions run on their own goroutines; they only post
// events here, and the main goroutine (Run) owns every decision.

// StopAfterTakeoverEnv, when set in a generation's environment, makes it
// stop itself (SIGSTOP) right after it has received the previous
// generation's sockets: a fault-injection hook for tests.
const StopAfterTakeoverEnv = "HOTPROXY_TEST_STOP_AFTER_TAKEOVER"

// hotRestart is a generation's hot-restart state.
type hotRestart struct {
	// listener waits for the next generation.
	listener *hotrestart.Parent
	// takeover is the connection to the generation this one took over
	// from. It stays open for this generation's life: while it is open
	// within the commit window, the previous generation knows this one
	// lives.
	takeover *hotrestart.Child
	// unused are the sockets taken over that this generation's config
	// does not want (a listener removed or moved): told to the previous
	// generation with the drain, so that it closes them once emptied.
	unused []hotrestart.Socket

	events  chan handoffEvent
	sockets chan chan socketsReply
	// stopped is closed when Run has returned, so that late sessions do
	// not wait for a main loop that is gone.
	stopped chan struct{}

	// handoff is the hand-over in progress to the next generation, if any.
	handoff *handoff
	// retired are managers that were drained by a hand-over and then
	// replaced by a rollback; they finish their connections on their own.
	retired []*workers.Manager
}

// handoff is this generation handing over to the next one.
type handoff struct {
	child hotrestart.Identity
	// kept are dups of every socket handed over, so that this generation
	// can serve again if the child dies within the commit window.
	kept      map[workers.SocketKey]*os.File
	keptAdmin *os.File
	// manager is the one draining; drained receives its result.
	manager *workers.Manager
	drained chan error
	done    bool // manager drained
	// commit fires commit_window after the hand-over; then no rollback.
	commit    *time.Timer
	committed bool
}

type handoffEvent struct {
	child   hotrestart.Identity
	drain   bool // the child serves and asks us to drain
	drained bool // ChildLost: whether we had been asked to drain
	err     error
	// unused (with drain): sockets the child did not take.
	unused []hotrestart.Socket
}

type socketsReply struct {
	sockets []hotrestart.Socket
	files   []*os.File
	err     error
}

func newHotRestart() hotRestart {
	return hotRestart{
		events:  make(chan handoffEvent, 4),
		sockets: make(chan chan socketsReply),
		stopped: make(chan struct{}),
	}
}

// restartIdentity is what this generation says of itself in hello.
func (s *Server) restartIdentity() hotrestart.Identity {
	id := hotrestart.Identity{
		PID:           s.identity.PID,
		Epoch:         s.opts.Epoch,
		BinaryVersion: version.Version,
		FirstStart:    s.firstStart.UnixNano(),
	}
	if s.opts.SupervisorPID != 0 {
		id.Features = append(id.Features, hotrestart.FeatureSupervised)
	}
	return id
}

// takeOver connects to the generation of epoch-1 and takes its listening
// sockets. With no such generation and AllowColdStart, it returns no
// sockets and the generation binds its own.
func (s *Server) takeOver() (inherited map[workers.SocketKey]*os.File, admin net.Listener, err error) {
	addr := hotrestart.Address(s.opts.BaseID, s.opts.Epoch-1, s.cfg.HotRestart.SocketDir)
	ch, err := hotrestart.Dial(addr, s.restartIdentity(), s.cfg.HotRestart.HandoffTimeout.D())
	if err != nil {
		if errors.Is(err, hotrestart.ErrNoParent) && s.opts.AllowColdStart {
			s.log.Warn("no previous generation to take over from: starting cold", "restart_socket", addr)
			return nil, nil, nil
		}
		if errors.Is(err, hotrestart.ErrNoParent) {
			return nil, nil, fmt.Errorf("hot restart to epoch %d: %w (start epoch 0 instead, or pass --allow-cold-start)", s.opts.Epoch, err)
		}
		return nil, nil, fmt.Errorf("hot restart to epoch %d: %w", s.opts.Epoch, err)
	}
	sockets, files, err := ch.Sockets()
	if err != nil {
		ch.Close()
		return nil, nil, fmt.Errorf("hot restart to epoch %d: receiving sockets: %w", s.opts.Epoch, err)
	}
	parent := ch.Parent()
	if parent.FirstStart > 0 {
		s.firstStart = time.Unix(0, parent.FirstStart)
	}
	inherited = make(map[workers.SocketKey]*os.File, len(sockets))
	for i, sk := range sockets {
		switch {
		case sk.Role == hotrestart.RoleAdmin && sk.Address == s.cfg.Admin.Address && admin == nil:
			admin, err = net.FileListener(files[i])
			files[i].Close()
			if err != nil {
				closeSocketFiles(inherited)
				ch.Close()
				return nil, nil, fmt.Errorf("hot restart: admin socket %s: %w", sk.Address, err)
			}
		case sk.Role == hotrestart.RoleListener:
			inherited[workers.SocketKey{Network: sk.Network, Address: sk.Address, Worker: sk.Worker}] = files[i]
		default:
			// The admin API moved: this generation binds its own, and
			// the old admin socket is left to the old generation.
			files[i].Close()
		}
	}
	s.hr.takeover = ch
	if os.Getenv(StopAfterTakeoverEnv) != "" {
		// Fault injection for tests: hold here, sockets in hand, not
		// yet serving, so a test can kill this generation at the worst
		// moment for the previous one.
		s.log.Warn("stopping after the takeover, as " + StopAfterTakeoverEnv + " asks")
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	s.log.Info("took over listening sockets", "from_pid", parent.PID, "from_epoch", parent.Epoch,
		"from_version", parent.BinaryVersion, "sockets", len(sockets))
	return inherited, admin, nil
}

func closeSocketFiles(files map[workers.SocketKey]*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// listenForSuccessor binds this generation's restart socket. It fails
// when a generation of the same base-id and epoch already runs: two
// generations must never believe they are the same one.
func (s *Server) listenForSuccessor() error {
	addr := hotrestart.Address(s.opts.BaseID, s.opts.Epoch, s.cfg.HotRestart.SocketDir)
	timeout := s.cfg.HotRestart.HandoffTimeout.D()
	p, err := hotrestart.Listen(hotrestart.ParentOptions{
		Address:      addr,
		Self:         s.restartIdentity(),
		Handler:      successorHandler{&s.hr},
		Logger:       s.log,
		Timeout:      timeout,
		ReadyTimeout: timeout,
		Supervisor:   s.opts.SupervisorPID,
	})
	if errors.Is(err, hotrestart.ErrGenerationRunning) {
		return fmt.Errorf("%w: a generation with base-id %d and epoch %d is already running; "+
			"take over from it with --restart-epoch %d, or run this one with another --base-id",
			err, s.opts.BaseID, s.opts.Epoch, s.opts.Epoch+1)
	}
	if err != nil {
		return err
	}
	s.hr.listener = p
	return nil
}

// successorHandler is the restart socket's view of the main loop.
type successorHandler struct{ hr *hotRestart }

var _ hotrestart.Handler = successorHandler{}

func (h successorHandler) Sockets() ([]hotrestart.Socket, []*os.File, error) {
	reply := make(chan socketsReply, 1)
	select {
	case h.hr.sockets <- reply:
	case <-h.hr.stopped:
		return nil, nil, errors.New("this generation has stopped")
	}
	r := <-reply
	return r.sockets, r.files, r.err
}

func (h successorHandler) Drain(child hotrestart.Identity, unused []hotrestart.Socket) {
	select {
	case h.hr.events <- handoffEvent{child: child, drain: true, unused: unused}:
	case <-h.hr.stopped:
	}
}

func (h successorHandler) ChildLost(child hotrestart.Identity, drained bool, err error) {
	select {
	case h.hr.events <- handoffEvent{child: child, drained: drained, err: err}:
	case <-h.hr.stopped:
	}
}

// socketsForSuccessor dups every listening socket, the admin listener's
// too, for the next generation.
func (s *Server) socketsForSuccessor() socketsReply {
	if s.State() != StateLive {
		return socketsReply{err: fmt.Errorf("this generation is %s, not serving: it has nothing to hand over", s.State())}
	}
	byKey, err := s.workers.Sockets()
	if err != nil {
		return socketsReply{err: err}
	}
	keys := make([]workers.SocketKey, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Address != keys[j].Address {
			return keys[i].Address < keys[j].Address
		}
		return keys[i].Worker < keys[j].Worker
	})
	var r socketsReply
	for _, k := range keys {
		r.sockets = append(r.sockets, hotrestart.Socket{Network: k.Network, Address: k.Address, Worker: k.Worker, Role: hotrestart.RoleListener})
		r.files = append(r.files, byKey[k])
	}
	admin, err := listenerFile(s.adminLn)
	if err != nil {
		closeFiles(r.files)
		return socketsReply{err: fmt.Errorf("admin listener: %w", err)}
	}
	r.sockets = append(r.sockets, hotrestart.Socket{Network: "tcp", Address: s.cfg.Admin.Address, Worker: -1, Role: hotrestart.RoleAdmin})
	r.files = append(r.files, admin)
	return r
}

func listenerFile(ln net.Listener) (*os.File, error) {
	if al, ok := ln.(*adminListener); ok {
		ln = al.Listener
	}
	fl, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("a %T cannot be handed over", ln)
	}
	return fl.File()
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// beginHandoff: the next generation serves and asks this one to drain.
// This one stops accepting (the successor accepts on the same sockets),
// keeps dups of them for the commit window, and drains.
//
// Sockets the successor did not take are not kept: once the drain has
// emptied their queues, the drain's close is their last descriptor's, so
// the kernel refuses new connections instead of queueing them where
// nobody will accept them (and resetting them when the commit window
// closes the dups). A rollback binds those listeners afresh.
func (s *Server) beginHandoff(child hotrestart.Identity, unused []hotrestart.Socket) {
	if s.State() != StateLive || s.hr.handoff != nil {
		s.log.Warn("a next generation asked this one to drain, but it is not serving", "child_pid", child.PID, "state", s.State())
		return
	}
	kept, err := s.workers.Sockets()
	if err != nil {
		s.log.Error("cannot keep the listening sockets for a rollback; handing over without one", "error", err)
	}
	var released []string
	for _, u := range unused {
		k := workers.SocketKey{Network: u.Network, Address: u.Address, Worker: u.Worker}
		if f, ok := kept[k]; ok {
			f.Close()
			delete(kept, k)
			released = append(released, fmt.Sprintf("%s/%d", k.Address, k.Worker))
		}
	}
	if len(released) > 0 {
		s.log.Info("the next generation does not take these sockets: they close once their queues are empty",
			"sockets", released)
	}
	keptAdmin, err := listenerFile(s.adminLn)
	if err != nil {
		s.log.Error("cannot keep the admin socket for a rollback", "error", err)
	}
	s.handedOver.Store(true)
	s.setState(StateDraining)
	h := &handoff{
		child:     child,
		kept:      kept,
		keptAdmin: keptAdmin,
		manager:   s.workers,
		drained:   make(chan error, 1),
		commit:    time.NewTimer(s.cfg.HotRestart.CommitWindow.D()),
	}
	s.hr.handoff = h
	s.log.Info("handing over to the next generation: draining", "child_pid", child.PID, "child_epoch", child.Epoch,
		"child_version", child.BinaryVersion, "drain_time", s.cfg.Server.DrainTime.D(),
		"parent_shutdown_time", s.cfg.Server.ParentShutdownTime.D(), "commit_window", s.cfg.HotRestart.CommitWindow.D())

	// HTTP connections get drain_time; TCP-proxy connections may run
	// until parent_shutdown_time.
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Server.ParentShutdownTime.D())
	go func() {
		defer cancel()
		h.drained <- h.manager.Drain(ctx, workers.DrainOptions{HTTPTimeout: s.cfg.Server.DrainTime.D()})
	}()
	// The successor serves the admin API on the same socket now; admin
	// connections this one has accepted are still answered.
	s.adminLn.stopAccepting()
}

// successorLost: the next generation's connection ended. Within the
// commit window after it asked us to drain, that means it died: serve
// again from the sockets kept for this.
func (s *Server) successorLost(ev handoffEvent) {
	h := s.hr.handoff
	switch {
	case !ev.drained:
		s.log.Warn("a next generation went away before it served; this one serves on", "child_pid", ev.child.PID, "error", ev.err)
		return
	case h == nil || h.committed:
		return
	}
	s.log.Warn("the next generation died within the commit window: serving again", "child_pid", ev.child.PID,
		"child_epoch", ev.child.Epoch, "error", ev.err)
	if err := s.rollback(h); err != nil {
		s.log.Error("rollback failed: this generation cannot serve again", "error", err)
		return
	}
	s.log.Info("serving again after a failed hand-over", "epoch", s.opts.Epoch, "pid", s.identity.PID)
}

// rollback rebuilds the workers and the admin API on the kept sockets.
// The drained manager finishes its own connections meanwhile.
func (s *Server) rollback(h *handoff) error {
	h.commit.Stop()
	s.hr.handoff = nil
	if !h.done {
		s.hr.retired = append(s.hr.retired, h.manager)
		go func(drained chan error, m *workers.Manager) {
			<-drained
			m.Close()
		}(h.drained, h.manager)
	}
	if h.kept == nil || h.keptAdmin == nil {
		return errors.New("the sockets were not kept")
	}
	m, err := workers.New(workers.Options{
		Config:      s.cfg,
		Concurrency: s.concurrency,
		Logger:      s.log,
		Inherited:   h.kept,
		Stats:       s.stats,
	}, s.snapshot)
	if err != nil {
		h.keptAdmin.Close()
		return err
	}
	adminLn, err := net.FileListener(h.keptAdmin)
	h.keptAdmin.Close()
	if err != nil {
		m.Close()
		return fmt.Errorf("admin socket: %w", err)
	}
	s.workers = m
	m.Start()
	s.handedOver.Store(false)
	s.setState(StateLive)
	go closeAdmin(s.admin)
	s.adminLn = &adminListener{Listener: adminLn}
	s.admin = s.newAdminServer()
	go s.admin.Serve(s.adminLn)
	return nil
}

// commitHandoff ends the way back: the kept sockets go, and so does the
// restart socket (this generation will never serve again, so nothing may
// take over from it; its sessions close, which tells the next generation
// to let go of its connection to this one).
func (s *Server) commitHandoff(why string) {
	h := s.hr.handoff
	h.committed = true
	h.commit.Stop()
	closeSocketFiles(h.kept)
	if h.keptAdmin != nil {
		h.keptAdmin.Close()
	}
	h.kept, h.keptAdmin = nil, nil
	// Close waits for the sessions, which report to this goroutine:
	// never wait for them here.
	go s.hr.listener.Close()
	s.log.Info("hand-over committed: "+why, "child_pid", h.child.PID)
}

// handoffDrained records the end of the drain; the generation exits once
// the hand-over is also committed.
func (s *Server) handoffDrained(err error) {
	h := s.hr.handoff
	h.done = true
	h.manager.Close()
	if err != nil {
		s.log.Warn("drain ended before every connection finished", "error", err)
	} else {
		s.log.Info("drained after the hand-over")
	}
}

// handoffFinished reports whether this generation has handed over for good
// and has nothing left to serve.
func (s *Server) handoffFinished() bool {
	h := s.hr.handoff
	return h != nil && h.committed && h.done
}

// handoffChannels are the main loop's hand-over timers and results; nil
// channels when no hand-over is in progress.
func (s *Server) handoffChannels() (commit <-chan time.Time, drained <-chan error) {
	h := s.hr.handoff
	if h == nil {
		return nil, nil
	}
	if !h.committed {
		commit = h.commit.C
	}
	if !h.done {
		drained = h.drained
	}
	return commit, drained
}

// tellPredecessorToDrain is called once this generation serves.
func (s *Server) tellPredecessorToDrain() {
	if s.hr.takeover == nil {
		return
	}
	if err := s.hr.takeover.Drain(s.hr.unused); err != nil {
		s.log.Warn("could not tell the previous generation to drain (is it gone?)", "error", err)
		s.hr.takeover.Close()
		return
	}
	go func(ch *hotrestart.Child) {
		if err := ch.AwaitRelease(); err != nil {
			s.log.Debug("connection to the previous generation ended", "error", err)
		}
	}(s.hr.takeover)
}

// closeHotRestart releases the restart socket and the connection to the
// previous generation.
func (s *Server) closeHotRestart() {
	select {
	case <-s.hr.stopped:
		return
	default:
	}
	close(s.hr.stopped)
	if s.hr.listener != nil {
		s.hr.listener.Close()
	}
	if s.hr.takeover != nil {
		s.hr.takeover.Close()
	}
	if h := s.hr.handoff; h != nil {
		h.commit.Stop()
		closeSocketFiles(h.kept)
		if h.keptAdmin != nil {
			h.keptAdmin.Close()
		}
	}
}
