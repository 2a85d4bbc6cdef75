package server

import (
	"errors"
	"fmt"
	"net"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/workers"
)

// successorLost: the next generation's connection ended. Within the
// commit window after it asked us to drain, that means it died: serve
// again from the sockets kept for this.
func (s *Server) successorLost(ev handoverEvent) {
	switch {
	case !ev.drained:
		s.log.Warn("a next generation went away before it served; this one serves on", "child_pid", ev.child.PID, "error", ev.err)
		return
	case s.hr.state != handoverHandingOver:
		return
	}
	s.log.Warn("the next generation died within the commit window: serving again", "child_pid", ev.child.PID,
		"child_epoch", ev.child.Epoch, "error", ev.err)
	if err := s.rollback(); err != nil {
		s.log.Error("rollback failed: this generation cannot serve again; it finishes its drain and exits", "error", err)
		s.commitHandover("the rollback failed")
		return
	}
	s.log.Info("serving again after a failed hand-over", "epoch", s.opts.Epoch, "pid", s.identity.PID)
}

// rollback rebuilds the workers and the admin API on the kept sockets.
// The drained manager finishes its own connections meanwhile. On error
// the state is unchanged (still handing over).
func (s *Server) rollback() error {
	if s.hr.kept == nil || s.hr.keptAdmin == nil {
		return errors.New("the sockets were not kept")
	}
	// The sockets of a listener the successor dropped may still be open,
	// their queues being emptied: served again as they are, not bound
	// afresh beside them.
	if s.hr.draining != nil {
		for k, f := range s.hr.draining.TakeBackClosing() {
			if _, dup := s.hr.kept[k]; dup {
				f.Close()
				continue
			}
			s.hr.kept[k] = f
		}
	}
	m, err := workers.New(workers.Options{
		Concurrency: s.concurrency,
		Logger:      s.log,
		Inherited:   s.hr.kept,
		Stats:       s.stats,
		ServerTLS:   s.tls.ServerConfigs(),

		HeartbeatInterval: s.wd.interval(),
	}, s.snapshot.Load())
	s.hr.kept = nil // workers.New owns them now, on success and failure
	if err != nil {
		return err
	}
	adminLn, err := net.FileListener(s.hr.keptAdmin)
	s.hr.keptAdmin.Close()
	s.hr.keptAdmin = nil
	if err != nil {
		m.Close()
		return fmt.Errorf("admin socket: %w", err)
	}
	s.hr.commit.Stop()
	if s.hr.drainResult != nil {
		// Still draining: it closes itself once done.
		s.hr.retired = append(s.hr.retired, s.hr.draining)
		go func(result chan error, m *workers.Manager) {
			<-result
			m.Close()
		}(s.hr.drainResult, s.hr.draining)
	}
	s.hr.draining, s.hr.drainResult, s.hr.child = nil, nil, hotrestart.Identity{}
	s.workers = m
	s.wd.manager.Store(m)
	m.Start()
	s.setHandover(handoverRolledBack, "the successor died within the commit window")
	s.setState(StateLive)
	go closeAdmin(s.admin)
	s.adminLn = &adminListener{Listener: adminLn}
	s.admin = s.newAdminServer()
	go s.admin.Serve(s.adminLn)
	s.keepSocketsWithSupervisor()
	return nil
}
