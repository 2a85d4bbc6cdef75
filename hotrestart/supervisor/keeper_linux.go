package supervisor

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
	"github.com/hotproxy/hotproxy/shm"
)

// The listening sockets the supervisor keeps (hot_restart.keep_listeners),
// and its watch over the serving generation's heartbeat
// (watchdog.supervisor_timeout).
//
// Every generation gets a link (hotrestart.NewLinkPair) at fd 4. Once it
// serves, it sends a duplicate of every listening socket it has over it;
// the set of the serving generation replaces the one kept before (a set
// sent by a generation still starting waits until it serves: one that
// fails must not leave a socket of its own here, queueing connections
// nobody accepts). When the serving generation dies or wedges, the next
// one starts with --restart-parent kept and asks for the set: it accepts
// the connections queued in the sockets the dead one listened on, and
// none is refused in between, where a cold start would reset the first
// and refuse the second until it binds. The kept set is let go of when
// nothing will take it: a stop, a generation that drained by itself, a
// cold start (whose fresh sockets would share a SO_REUSEPORT group with
// kept ones nobody accepts on), keep_listeners turned off.
//
// A re-execution in place does not carry the kept sockets over: until
// the serving generation next sends its set (its next reload), a crash
// starts the next one cold, as before.

// generationLinkFD is the descriptor a generation's link has in it.
const generationLinkFD = 4

// keptSet is a set of listening sockets with their files.
type keptSet struct {
	sockets []hotrestart.Socket
	files   []*os.File
}

func (k *keptSet) close() {
	if k != nil {
		hotrestart.CloseFiles(k.files)
	}
}

// keepMsg: a generation sent its sockets.
type keepMsg struct {
	gen *generation
	set *keptSet
}

// keptReq: a generation asks for the kept sockets; reply gets dups the
// link's goroutine sends and closes (nil: none kept, err says why).
type keptReq struct {
	gen   *generation
	reply chan keptReply
}

type keptReply struct {
	set *keptSet
	err string
}

// keepEnabled is hot_restart.keep_listeners.
func (s *Supervisor) keepEnabled() bool {
	return s.cfg != nil && s.cfg.HotRestart.KeepListenersEnabled()
}

// haveKept is machine.keptSockets.
func (s *Supervisor) haveKept() bool { return s.kept != nil && s.keepEnabled() }

// newLink makes g's link; the child's end goes to the child as fd 4.
func (s *Supervisor) newLink() (*net.UnixConn, *os.File, error) {
	return hotrestart.NewLinkPair()
}

// serveLink answers g's link until it closes, posting to the loop. It
// reads nothing of g (the loop owns it): epoch and pid are for its logs.
func (s *Supervisor) serveLink(g *generation, epoch, pid int, uc *net.UnixConn, keeps bool, timeout time.Duration) {
	defer uc.Close()
	self := hotrestart.Identity{PID: os.Getpid(), BinaryVersion: version.Version}
	l, err := hotrestart.AcceptGenerationLink(uc, self, keeps, timeout)
	if err != nil {
		s.log.Debug("no link with the generation (an older binary, or it died first)", "epoch", epoch, "pid", pid, "error", err)
		return
	}
	for {
		req, err := l.Next()
		if err != nil {
			if !hotrestart.IsClosed(err) {
				s.log.Warn("the link with a generation failed", "epoch", epoch, "pid", pid, "error", err)
			}
			return
		}
		switch {
		case req.Keep:
			select {
			case s.keepCh <- keepMsg{gen: g, set: &keptSet{sockets: req.Sockets, files: req.Files}}:
			case <-s.exited:
				hotrestart.CloseFiles(req.Files)
				return
			}
		case req.GetSockets:
			reply := make(chan keptReply, 1)
			select {
			case s.keptReqCh <- keptReq{gen: g, reply: reply}:
			case <-s.exited:
				return
			}
			r := <-reply
			if r.set == nil {
				l.Refuse(r.err)
				continue
			}
			if err := l.SendSockets(r.set.sockets, r.set.files); err != nil {
				s.log.Warn("cannot hand the kept sockets to the new generation", "epoch", epoch, "pid", pid, "error", err)
			}
			r.set.close()
		}
	}
}

// onKeep takes the set a generation sent.
func (s *Supervisor) onKeep(k keepMsg) {
	switch {
	case !s.keepEnabled() || s.machine.stopping:
		k.set.close()
	case k.gen.state == StateServing && s.find(k.gen.pid) == k.gen:
		s.replaceKept(k.set, k.gen)
	case k.gen.state == StateStarting && s.find(k.gen.pid) == k.gen:
		s.pendingKept[k.gen].close()
		s.pendingKept[k.gen] = k.set
	default:
		k.set.close()
	}
}

// replaceKept makes set the kept one, closing the one before.
func (s *Supervisor) replaceKept(set *keptSet, from *generation) {
	s.kept.close()
	s.kept = set
	s.log.Debug("keeping the serving generation's listening sockets", "epoch", from.epoch, "pid", from.pid, "sockets", len(set.files))
}

// dropKeptSockets is machine.dropKept.
func (s *Supervisor) dropKeptSockets(why string) { s.dropKept(why) }

// dropKept lets go of the kept sockets.
func (s *Supervisor) dropKept(why string) {
	if s.kept != nil {
		s.log.Info("letting go of the kept listening sockets", "why", why, "sockets", len(s.kept.files))
		s.kept.close()
		s.kept = nil
	}
}

// syncKept runs after every event: a pending set whose generation now
// serves is kept; one whose generation failed or is gone is dropped; and
// the kept set goes when nothing will take it.
func (s *Supervisor) syncKept() {
	for g, set := range s.pendingKept {
		switch {
		case g.state == StateServing && s.find(g.pid) == g:
			s.replaceKept(set, g)
			delete(s.pendingKept, g)
		case g.state != StateStarting || s.find(g.pid) != g:
			set.close()
			delete(s.pendingKept, g)
		}
	}
	switch {
	case s.machine.stopping:
		// The last generation drains: its queues must empty and its
		// sockets close, so that the kernel refuses what comes next
		// instead of queueing it here.
		s.dropKept("the supervisor stops")
	case s.quitWhenEmpty:
		s.dropKept("the serving generation drained and exited by itself")
	case !s.keepEnabled():
		s.dropKept("hot_restart.keep_listeners is false")
	}
}

// onKeptReq answers a generation that asks for the kept sockets with dups.
func (s *Supervisor) onKeptReq(r keptReq) {
	if s.kept == nil {
		r.reply <- keptReply{err: "the supervisor keeps no listening sockets (none were sent, or they were let go of): start cold"}
		return
	}
	set := &keptSet{sockets: s.kept.sockets}
	for _, f := range s.kept.files {
		d, err := dupFile(f)
		if err != nil {
			set.close()
			r.reply <- keptReply{err: fmt.Sprintf("the supervisor cannot duplicate a kept socket: %v", err)}
			return
		}
		set.files = append(set.files, d)
	}
	s.log.Info("handing the kept listening sockets to the new generation", "epoch", r.gen.epoch, "pid", r.gen.pid, "sockets", len(set.files))
	r.reply <- keptReply{set: set}
}

// dupFile duplicates f's descriptor, close-on-exec, without touching its
// blocking mode (see hotrestart/conn_linux.go on why not f.Fd()).
func dupFile(f *os.File) (*os.File, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	nfd := -1
	var derr error
	raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// watchInterval is how often the serving generation's heartbeat is read.
func (s *Supervisor) watchInterval() time.Duration {
	if s.cfg == nil {
		return time.Second
	}
	return min(max(s.cfg.Watchdog.SupervisorTimeout.D()/4, 50*time.Millisecond), 5*time.Second)
}

// watchHeartbeat reads the serving generation's heartbeat in the stats
// region's owner table and declares it wedged when it is older than
// watchdog.supervisor_timeout. A generation that serves for less than the
// timeout, or that has no owner entry (no region), is not judged.
func (s *Supervisor) watchHeartbeat() {
	g := s.serving()
	if g == nil || s.machine.stopping || s.cfg == nil {
		return
	}
	timeout := s.cfg.Watchdog.SupervisorTimeout.D()
	if time.Since(g.readyAt) < timeout {
		return
	}
	path := s.cfg.Stats.Path
	if path == "" {
		path = shm.DefaultPath(uint64(s.opts.BaseID))
	}
	owners, err := shm.LiveOwners(path)
	if err != nil {
		s.watchFailures.Warn("cannot read the generations' heartbeats in the stats region", "path", path, "error", err)
		return
	}
	for _, ow := range owners {
		if ow.PID != g.pid {
			continue
		}
		if age := time.Since(ow.Heartbeat); age > timeout {
			s.onWedged(g, age)
		}
		return
	}
}
