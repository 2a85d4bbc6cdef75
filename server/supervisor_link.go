package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/workers"
)

// The link to the supervisor (hotrestart.SupervisorLink, serve
// --supervisor-fd): once this generation serves, and again after a
// rollback, it sends the supervisor a duplicate of every listening socket,
// the admin API's too. When this generation dies or wedges, the
// supervisor starts the next one on those very sockets (serve
// --restart-parent kept): the connections queued in them are accepted by
// the next generation instead of reset, and none is refused meanwhile.

// openSupervisorLink opens the link from the inherited descriptor. A link
// that does not open is logged and left out, unless this generation is to
// take its sockets from it.
func (s *Server) openSupervisorLink() error {
	f := s.opts.SupervisorLink
	if f == nil {
		if s.opts.TakeKeptSockets {
			return errors.New("--restart-parent kept needs --supervisor-fd: the supervisor's link is where the kept sockets come from")
		}
		return nil
	}
	link, err := hotrestart.OpenSupervisorLink(f, s.opts.SupervisorPID, s.restartIdentity(), s.cfg.HotRestart.HandoffTimeout.D())
	if err != nil {
		if s.opts.TakeKeptSockets {
			return fmt.Errorf("taking over the kept sockets: %w", err)
		}
		s.log.Warn("no link to the supervisor: it will not keep this generation's listening sockets (a crash resets the connections queued in them)",
			"error", err)
		return nil
	}
	s.link = link
	return nil
}

// takeKeptSockets receives the sockets the supervisor kept of the
// generation that died or wedged, in the shape takeOver returns.
func (s *Server) takeKeptSockets() (map[workers.SocketKey]*os.File, net.Listener, error) {
	sockets, files, err := s.link.KeptSockets()
	if err != nil {
		return nil, nil, fmt.Errorf("taking over the sockets the supervisor kept: %w (the supervisor starts the next generation cold if this one fails)", err)
	}
	inherited := make(map[workers.SocketKey]*os.File, len(sockets))
	var admin net.Listener
	for i, sk := range sockets {
		switch {
		case sk.Role == hotrestart.RoleAdmin && sk.Address == s.cfg.Admin.Address && admin == nil:
			admin, err = net.FileListener(files[i])
			files[i].Close()
			if err != nil {
				closeSocketFiles(inherited)
				hotrestart.CloseFiles(files[i+1:])
				return nil, nil, fmt.Errorf("kept admin socket %s: %w", sk.Address, err)
			}
		case sk.Role == hotrestart.RoleListener:
			inherited[workers.SocketKey{Network: sk.Network, Address: sk.Address, Worker: sk.Worker}] = files[i]
		default:
			files[i].Close()
		}
	}
	s.log.Info("took over the listening sockets the supervisor kept of the previous generation", "sockets", len(sockets))
	return inherited, admin, nil
}

// keepSocketsWithSupervisor sends the supervisor a duplicate of every
// listening socket. Called on the main goroutine when the generation
// starts serving (and serves again after a rollback): the set it sends
// replaces the previous generation's, so that a socket this one does not
// listen on any more is not kept open, queueing connections nobody
// accepts.
func (s *Server) keepSocketsWithSupervisor() {
	if s.link == nil || !s.link.KeepsSockets() {
		return
	}
	byKey, err := s.workers.SocketDups()
	if err != nil {
		s.log.Warn("cannot give the supervisor the listening sockets to keep", "error", err)
		return
	}
	keys := make([]workers.SocketKey, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b workers.SocketKey) int {
		if c := strings.Compare(a.Address, b.Address); c != 0 {
			return c
		}
		return a.Worker - b.Worker
	})
	var sockets []hotrestart.Socket
	var files []*os.File
	for _, k := range keys {
		sockets = append(sockets, hotrestart.Socket{Network: k.Network, Address: k.Address, Worker: k.Worker, Role: hotrestart.RoleListener})
		files = append(files, byKey[k])
	}
	if admin, err := listenerFile(s.adminLn); err == nil {
		sockets = append(sockets, hotrestart.Socket{Network: "tcp", Address: s.cfg.Admin.Address, Worker: -1, Role: hotrestart.RoleAdmin})
		files = append(files, admin)
	} else {
		s.log.Warn("the supervisor keeps no copy of the admin socket", "error", err)
	}
	defer hotrestart.CloseFiles(files)
	if err := s.link.Keep(sockets, files); err != nil {
		s.log.Warn("cannot give the supervisor the listening sockets to keep", "error", err)
		return
	}
	s.log.Debug("the supervisor keeps the listening sockets", "sockets", len(sockets))
}

func (s *Server) closeSupervisorLink() {
	if s.link != nil {
		s.link.Close()
		s.link = nil
	} else if f := s.opts.SupervisorLink; f != nil {
		f.Close() // never opened: New failed before
	}
}
