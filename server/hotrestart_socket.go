package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/tlsconf"
	"github.com/hotproxy/hotproxy/workers"
)

// The restart socket: where the next generation finds this one and asks
// for its sockets. Its sessions run on their own goroutines and only post
// to the main loop; what the loop decides is in hotrestart_handover.go.

// listenForSuccessor binds this generation's restart socket. It fails
// when a generation of the same base-id and epoch already runs: two
// generations must never believe they are the same one.
func (s *Server) listenForSuccessor() error {
	addrs := hotrestart.Addresses(s.opts.BaseID, s.opts.Epoch, s.cfg.HotRestart.SocketDir)
	timeout := s.cfg.HotRestart.HandoffTimeout.D()
	p, err := hotrestart.Listen(hotrestart.ParentOptions{
		Address:      addrs[0],
		Alternates:   addrs[1:],
		Self:         s.restartIdentity(),
		Handler:      successorHandler{hr: &s.hr, tls: &s.tlsNow, xds: &s.xdsNow},
		Logger:       s.log,
		Timeout:      timeout,
		ReadyTimeout: timeout,
		Supervisor:   s.opts.SupervisorPID,
	})
	if errors.Is(err, hotrestart.ErrGenerationRunning) {
		if s.opts.SupervisorPID != 0 {
			// A supervisor picks the epochs; --restart-epoch is not
			// this generation's to give.
			return fmt.Errorf("%w: a generation with base-id %d and epoch %d is already running, not this supervisor's; "+
				"start the supervisor with --take-over to take over from it, or give it another --base-id (or $HOTPROXY_BASE_ID)",
				err, s.opts.BaseID, s.opts.Epoch)
		}
		return fmt.Errorf("%w: a generation with base-id %d and epoch %d is already running; "+
			"take over from it with --restart-epoch %d, or run this one with another --base-id",
			err, s.opts.BaseID, s.opts.Epoch, s.opts.Epoch+1)
	}
	if err != nil {
		return err
	}
	if p.Addr() != addrs[0] {
		s.log.Warn("listening for the next generation on an alternate restart socket: another user holds the usual one",
			"restart_socket", p.Addr(), "usual", addrs[0])
	}
	s.hr.listener = p
	return nil
}

// successorHandler is the restart socket's view of the main loop, and of
// the TLS session-ticket keys (tls.go).
type successorHandler struct {
	hr  *handover
	tls *atomic.Pointer[tlsconf.Set] // the set serving now (Server.tlsNow)
	xds *atomic.Pointer[xdsLink]     // the xDS client (Server.xdsNow), for XDSResources
}

var (
	_ hotrestart.Handler           = successorHandler{}
	_ hotrestart.EarlyCommitter    = successorHandler{}
	_ hotrestart.TicketKeySource   = successorHandler{}
	_ hotrestart.XDSResourceSource = successorHandler{}
)

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
	h.post(handoverEvent{kind: eventDrain, child: child, unused: unused})
}

func (h successorHandler) ChildLost(child hotrestart.Identity, drained bool, err error) {
	h.post(handoverEvent{kind: eventLost, child: child, drained: drained, err: err})
}

// Commit: the child, after it asked us to drain, hands over in turn.
func (h successorHandler) Commit(child hotrestart.Identity) {
	h.post(handoverEvent{kind: eventCommit, child: child})
}

func (h successorHandler) post(ev handoverEvent) {
	select {
	case h.hr.events <- ev:
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
	slices.SortFunc(keys, func(a, b workers.SocketKey) int {
		if c := strings.Compare(a.Address, b.Address); c != 0 {
			return c
		}
		return a.Worker - b.Worker
	})
	var r socketsReply
	for _, k := range keys {
		r.sockets = append(r.sockets, hotrestart.Socket{Network: k.Network, Address: k.Address, Worker: k.Worker, Role: hotrestart.RoleListener})
		r.files = append(r.files, byKey[k])
	}
	admin, err := listenerFile(s.adminLn)
	if err != nil {
		hotrestart.CloseFiles(r.files)
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
