package server

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/workers"
)

// The parent side of hot restart: this generation hands over to the next
// one. The restart socket's sessions run on their own goroutines; they
// only post requests and events here, and the main goroutine (Run) owns
// every decision and the one state below. The child side is in
// hotrestart_takeover.go; docs/hot-restart.md walks through both.

// handoverState is where this generation is in handing over to the next.
//
//	live ──successor serves──▶ handingOver ──commit window ends──▶ committed ──drain ends──▶ drained
//	  ▲                          │
//	  └────── rolledBack ◀───────┘ successor died within the commit window
//
// rolledBack serves like live (and may hand over again); drained is the
// end: Run returns.
type handoverState int

const (
	handoverLive        handoverState = iota // serving, nothing handed over
	handoverHandingOver                      // the successor serves, this one drains and can still serve again
	handoverRolledBack                       // the successor died within the commit window: serving again
	handoverCommitted                        // no way back; the drain goes on
	handoverDrained                          // committed and drained: nothing left to do
)

func (h handoverState) String() string {
	switch h {
	case handoverLive:
		return "live"
	case handoverHandingOver:
		return "handing over"
	case handoverRolledBack:
		return "rolled back"
	case handoverCommitted:
		return "committed"
	case handoverDrained:
		return "drained"
	}
	return fmt.Sprintf("handoverState(%d)", int(h))
}

// serving reports whether a generation in this state serves traffic.
func (h handoverState) serving() bool { return h == handoverLive || h == handoverRolledBack }

// handoverEdges are the transitions that may happen; anything else is a
// bug, logged and refused.
var handoverEdges = map[handoverState][]handoverState{
	handoverLive:        {handoverHandingOver},
	handoverRolledBack:  {handoverHandingOver},
	handoverHandingOver: {handoverRolledBack, handoverCommitted},
	handoverCommitted:   {handoverDrained},
}

// handover is a generation's parent-side hot-restart state. Every field
// but the channels and stopped is owned by the main goroutine.
type handover struct {
	// listener waits for the next generation.
	listener *hotrestart.Parent
	state    handoverState

	// The hand-over in progress (handingOver and committed); reset by
	// a rollback.
	child hotrestart.Identity
	// kept are dups of every socket handed over, so that this generation
	// can serve again if the child dies within the commit window; nil
	// once committed.
	kept      map[workers.SocketKey]*os.File
	keptAdmin *os.File
	// draining is the manager being drained; drainResult receives the
	// drain's outcome and is nil once it has.
	draining    *workers.Manager
	drainResult chan error
	// commit fires commit_window after the hand-over began.
	commit *time.Timer

	// retired are managers that were drained by a hand-over and then
	// replaced by a rollback; they finish their connections on their own.
	retired []*workers.Manager

	events  chan handoverEvent
	sockets chan chan socketsReply
	// stopped is closed when Run has returned, so that late sessions do
	// not wait for a main loop that is gone.
	stopped chan struct{}
}

// handoverEventKind is what a restart-socket session reports.
type handoverEventKind int

const (
	eventDrain  handoverEventKind = iota // the child serves and asks us to drain
	eventLost                            // the child's connection ended
	eventCommit                          // the child hands over in turn: commit now
)

type handoverEvent struct {
	kind  handoverEventKind
	child hotrestart.Identity
	// drained (eventLost): whether the child had asked us to drain.
	drained bool
	err     error
	// unused (eventDrain): sockets the child did not take.
	unused []hotrestart.Socket
}

type socketsReply struct {
	sockets []hotrestart.Socket
	files   []*os.File
	err     error
}

func newHandover() handover {
	return handover{
		events:  make(chan handoverEvent, 4),
		sockets: make(chan chan socketsReply),
		stopped: make(chan struct{}),
	}
}

// setHandover is the one place the hand-over state changes. It also
// publishes it for the admin API, which runs on other goroutines.
func (s *Server) setHandover(to handoverState, why string) bool {
	from := s.hr.state
	if !slices.Contains(handoverEdges[from], to) {
		s.log.Error("hand-over: refused an impossible transition (a bug)", "from", from.String(), "to", to.String(), "why", why)
		return false
	}
	s.hr.state = to
	s.handoverPublished.Store(int32(to))
	s.log.Debug("hand-over: "+from.String()+" → "+to.String(), "why", why, "epoch", s.opts.Epoch)
	return true
}

// handedOver reports, from any goroutine, whether this generation drains
// because a LIVE successor took over its sockets.
func (s *Server) handedOver() bool {
	st := handoverState(s.handoverPublished.Load())
	return !st.serving()
}

// onHandoverEvent is the main loop's handling of what a session posted.
func (s *Server) onHandoverEvent(ev handoverEvent) {
	switch ev.kind {
	case eventDrain:
		s.beginHandover(ev.child, ev.unused)
	case eventLost:
		s.successorLost(ev)
	case eventCommit:
		if s.hr.state == handoverHandingOver && ev.child.PID == s.hr.child.PID {
			s.commitHandover("the next generation hands over in turn to a newer one, which supersedes it")
		}
	}
}

// beginHandover: the next generation serves and asks this one to drain.
// This one stops accepting (the successor accepts on the same sockets),
// keeps dups of them for the commit window, and drains.
//
// Sockets the successor did not take are not kept: once the drain has
// emptied their queues, the drain's close is their last descriptor's, so
// the kernel refuses new connections instead of queueing them where
// nobody will accept them (and resetting them when the commit window
// closes the dups). A rollback binds those listeners afresh.
func (s *Server) beginHandover(child hotrestart.Identity, unused []hotrestart.Socket) {
	if !s.hr.state.serving() || s.State() != StateLive {
		s.log.Warn("a next generation asked this one to drain, but it is not serving", "child_pid", child.PID,
			"state", s.State(), "handover", s.hr.state.String())
		return
	}
	kept, err := s.workers.Sockets()
	if err != nil {
		s.log.Error("cannot keep the listening sockets for a rollback; handing over without one", "error", err)
	}
	var released []string
	unusedKeys := make(map[workers.SocketKey]bool, len(unused))
	for _, u := range unused {
		k := workers.SocketKey{Network: u.Network, Address: u.Address, Worker: u.Worker}
		unusedKeys[k] = true
		if f, ok := kept[k]; ok {
			f.Close()
			delete(kept, k)
			released = append(released, fmt.Sprintf("%s/%d", k.Address, k.Worker))
		}
	}
	// Sockets let go of their steering for the next generation; those it
	// did not take get theirs back, so that the drain refuses new
	// connections to them instead of queueing ones it would reset.
	s.workers.Resteer(unusedKeys)
	if len(released) > 0 {
		s.log.Info("the next generation does not take these sockets: they close once their queues are empty",
			"sockets", released)
	}
	// The rest the next generation accepts on: their drain leaves what is
	// on its way in them to it.
	handedOver := make(map[workers.SocketKey]bool, len(kept))
	for k := range kept {
		handedOver[k] = true
	}
	keptAdmin, err := listenerFile(s.adminLn)
	if err != nil {
		s.log.Error("cannot keep the admin socket for a rollback", "error", err)
	}
	s.hr.child = child
	s.hr.kept, s.hr.keptAdmin = kept, keptAdmin
	s.hr.draining = s.workers
	s.hr.drainResult = make(chan error, 1)
	s.hr.commit = time.NewTimer(s.cfg.HotRestart.CommitWindow.D())
	s.setHandover(handoverHandingOver, fmt.Sprintf("epoch %d (pid %d) serves and asked this one to drain", child.Epoch, child.PID))
	s.setState(StateDraining)
	s.log.Info("handing over to the next generation: draining", "child_pid", child.PID, "child_epoch", child.Epoch,
		"child_version", child.BinaryVersion, "drain_time", s.cfg.Server.DrainTime.D(),
		"parent_shutdown_time", s.cfg.Server.ParentShutdownTime.D(), "commit_window", s.cfg.HotRestart.CommitWindow.D())

	// HTTP connections get drain_time; TCP-proxy connections may run
	// until parent_shutdown_time.
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Server.ParentShutdownTime.D())
	m, result := s.hr.draining, s.hr.drainResult
	go func() {
		defer cancel()
		result <- m.Drain(ctx, workers.DrainOptions{HTTPTimeout: s.cfg.Server.DrainTime.D(), HandedOver: handedOver})
	}()
	// The successor serves the admin API on the same socket now; admin
	// connections this one has accepted are still answered.
	s.adminLn.stopAccepting()
	s.tellPredecessorToCommit()
}

// commitHandover ends the way back: the kept sockets go, and so does the
// restart socket (this generation will never serve again, so nothing may
// take over from it; its sessions close, which tells the next generation
// to let go of its connection to this one).
func (s *Server) commitHandover(why string) {
	if !s.setHandover(handoverCommitted, why) {
		return
	}
	s.hr.commit.Stop()
	s.releaseKept()
	// Close waits for the sessions, which report to this goroutine:
	// never wait for them here.
	go s.hr.listener.Close()
	// No way back: the xDS stream is the next generation's alone (Run
	// waits for the client to end).
	if s.xdsc != nil {
		s.xdsc.cancel()
	}
	s.log.Info("hand-over committed: "+why, "child_pid", s.hr.child.PID)
	if s.hr.drainResult == nil {
		s.setHandover(handoverDrained, "the drain had already ended")
	}
}

func (s *Server) releaseKept() {
	closeSocketFiles(s.hr.kept)
	if s.hr.keptAdmin != nil {
		s.hr.keptAdmin.Close()
	}
	s.hr.kept, s.hr.keptAdmin = nil, nil
}

// onDrained records the end of the hand-over's drain; the generation exits
// once the hand-over is also committed.
func (s *Server) onDrained(err error) {
	s.hr.drainResult = nil
	s.hr.draining.Close()
	if err != nil {
		s.log.Warn("drain ended before every connection finished", "error", err)
	} else {
		s.log.Info("drained after the hand-over")
	}
	if s.hr.state == handoverCommitted {
		s.setHandover(handoverDrained, "the drain ended")
	}
}

// handoverChannels are the main loop's hand-over timers and results: nil
// channels (never ready) for what the state does not wait on.
func (s *Server) handoverChannels() (commit <-chan time.Time, drained <-chan error) {
	switch s.hr.state {
	case handoverHandingOver:
		return s.hr.commit.C, s.hr.drainResult
	case handoverCommitted:
		return nil, s.hr.drainResult
	}
	return nil, nil
}

// finishHandover stops a generation that was already draining for its
// successor: no rollback any more, and the drain under way is bounded by
// drain_time from now.
func (s *Server) finishHandover(reason string, sigs <-chan os.Signal) error {
	s.log.Info("stopping during a hand-over: no rollback", "reason", reason)
	if s.hr.state == handoverHandingOver {
		s.commitHandover("stopping: " + reason)
	}
	if s.hr.state == handoverCommitted {
		timer := time.NewTimer(s.cfg.Server.DrainTime.D())
		defer timer.Stop()
		select {
		case err := <-s.hr.drainResult:
			s.onDrained(err)
		case <-timer.C:
		case <-sigs:
		}
		if s.hr.state != handoverDrained {
			s.hr.draining.Close()
		}
	}
	s.closeRetired()
	closeAdmin(s.admin)
	return nil
}

func (s *Server) closeRetired() {
	for _, m := range s.hr.retired {
		m.Close()
	}
}

// closeHotRestart releases the restart socket, the connection to the
// previous generation and whatever was kept for a rollback.
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
	if s.takeover.predecessor != nil {
		s.takeover.predecessor.Close()
	}
	if s.hr.commit != nil {
		s.hr.commit.Stop()
	}
	s.releaseKept()
}
