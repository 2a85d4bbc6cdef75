package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
	"github.com/hotproxy/hotproxy/workers"
)

// The child side of hot restart: this generation takes over from the one
// of epoch-1 (New calls takeOver before anything is bound), serves, and
// then tells that one to drain (Run calls tellPredecessorToDrain). The
// parent side, handing over to the next generation, is in
// hotrestart_handover.go; docs/hot-restart.md walks through both.

// takeover is this generation's link to the one it took over from.
type takeover struct {
	// predecessor is the connection to the generation this one took over
	// from. It stays open for this generation's life: while it is open
	// within the commit window, the previous generation knows this one
	// lives.
	predecessor *hotrestart.Child
	// unused are the sockets taken over that this generation's config
	// does not want (a listener removed or moved): told to the previous
	// generation with the drain, so that it closes them once emptied.
	unused []hotrestart.Socket
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
	addrs := hotrestart.Addresses(s.opts.BaseID, s.opts.Epoch-1, s.cfg.HotRestart.SocketDir)
	addr := addrs[0]
	if s.opts.NoParent {
		// The supervisor's word, from its own process table: nothing of
		// epoch N-1 serves. Whatever listens at its name is not ours.
		s.log.Warn("the supervisor says no generation serves: starting cold, without dialing the previous epoch's restart socket",
			"restart_socket", addr)
		return nil, nil, nil
	}
	ch, err := hotrestart.DialParent(hotrestart.DialOptions{
		Addresses: addrs,
		Self:      s.restartIdentity(),
		Timeout:   s.cfg.HotRestart.HandoffTimeout.D(),
		Expect:    s.opts.Parent,
		Logger:    s.log,
	})
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
	// The predecessor's xDS resources are validated and built before
	// any socket is taken: an error leaves it serving, untouched.
	if err := s.takeXDSResources(ch); err != nil {
		ch.Close()
		return nil, nil, fmt.Errorf("hot restart to epoch %d: %w", s.opts.Epoch, err)
	}
	sockets, files, err := ch.Sockets()
	if err != nil {
		ch.Close()
		return nil, nil, fmt.Errorf("hot restart to epoch %d: receiving sockets: %w", s.opts.Epoch, err)
	}
	// The keys before anything serves: the first connection this
	// generation accepts may carry a ticket the previous one issued.
	if err := s.takeTicketKeys(ch); err != nil {
		hotrestart.CloseFiles(files)
		ch.Close()
		return nil, nil, fmt.Errorf("hot restart to epoch %d: %w", s.opts.Epoch, err)
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
	s.takeover.predecessor = ch
	if s.opts.StopAfterTakeover {
		// Fault injection for tests: hold here, sockets in hand, not
		// yet serving, so a test can kill this generation at the worst
		// moment for the previous one.
		s.log.Warn("stopping after the takeover, as Options.StopAfterTakeover asks")
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	s.log.Info("took over listening sockets", "from_pid", parent.PID, "from_epoch", parent.Epoch,
		"from_version", parent.BinaryVersion, "sockets", len(sockets))
	return inherited, admin, nil
}

// tellPredecessorToDrain is called once this generation serves.
func (s *Server) tellPredecessorToDrain() {
	ch := s.takeover.predecessor
	if ch == nil {
		return
	}
	if err := ch.Drain(s.takeover.unused); err != nil {
		s.log.Warn("could not tell the previous generation to drain (is it gone?)", "error", err)
		ch.Close()
		return
	}
	go func() {
		if err := ch.AwaitRelease(); err != nil {
			s.log.Debug("connection to the previous generation ended", "error", err)
		}
	}()
}

// tellPredecessorToCommit is called when this generation begins to hand
// over to the next: if the one it took over from is still within its
// commit window, it could serve again should this one die, while the next
// one serves too. The next one supersedes this one as the generation to
// return to, so the previous one commits now.
func (s *Server) tellPredecessorToCommit() {
	ch := s.takeover.predecessor
	if ch == nil {
		return
	}
	if err := ch.Commit(); err != nil {
		// Already released (it committed), or gone.
		s.log.Debug("could not tell the previous generation to commit (it has let go already?)", "error", err)
	}
}

func closeSocketFiles(files map[workers.SocketKey]*os.File) {
	for _, f := range files {
		f.Close()
	}
}
