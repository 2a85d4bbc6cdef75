package server

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/hotproxy/hotproxy/workers"
)

// Logs and SIGUSR1: logrotate moves a log file away and sends
// SIGUSR1 (the supervisor forwards it to every generation); each workers
// Manager of this generation then reopens its logs' paths. The workers
// own the files: a hot restart needs no hand-over of them, since each
// generation appends its own requests' lines to the same paths. The
// process log's file ([log] path) is reopened by the same handler.

// reopenSignals returns the channel SIGUSR1 arrives on, and the function
// that stops it. Without Options.HandleSignals the channel never
// receives.
func (s *Server) reopenSignals() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	if !s.opts.HandleSignals {
		return ch, func() {}
	}
	signal.Notify(ch, syscall.SIGUSR1)
	return ch, func() { signal.Stop(ch) }
}

// reopenLogs handles SIGUSR1: the process log's file first, so that the
// lines that follow, these included, land in the new file; then the
// access logs.
func (s *Server) reopenLogs() {
	if lf := s.opts.LogFile; lf != nil {
		if err := lf.Reopen(); err != nil {
			s.log.Error("SIGUSR1: cannot reopen the process log; still writing to the old file", "error", err)
		} else {
			s.log.Info("SIGUSR1: process log reopened", "path", lf.Path())
		}
	}
	s.reopenAccessLogs()
}

// reopenAccessLogs asks the access logs of the serving Manager and of any
// still draining (a hand-over, a rollback) to reopen; on the main
// goroutine, which owns the list of them. It does not wait for the
// writers (each logs a failure itself).
func (s *Server) reopenAccessLogs() {
	seen := map[*workers.Manager]bool{}
	ms := append([]*workers.Manager{s.workers, s.hr.draining}, s.hr.retired...)
	n := 0
	for _, m := range ms {
		if m == nil || seen[m] {
			continue
		}
		seen[m] = true
		m.ReopenAccessLogs()
		n++
	}
	s.log.Info("SIGUSR1: access logs asked to reopen", "managers", n)
}
