package server

import (
	"context"
	"sync"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
)

// healthMonitors are the generation's cluster monitors (active health
// checks, outlier ejection), run on the main side, never on a worker.
type healthMonitors struct {
	list []*upstream.Monitor
	// names[i] is the cluster of list[i].
	names []string
}

// startHealthChecks builds a monitor for every cluster that has health
// checks or outlier detection and runs one round of checks of every
// endpoint, all clusters at once, before anything else of the generation
// happens. This is how a new generation starts after a hot restart: the
// round runs before the hand-over, so the previous generation still serves
// meanwhile, and this one routes from its first request only to endpoints
// it has found healthy itself (when none passes, to all: panic mode, so
// that a generation whose checks cannot get through still serves). The
// round is bounded by the longest health_check.timeout.
func (s *Server) startHealthChecks() {
	for _, c := range s.snapshot.Load().Clusters() {
		if m := upstream.NewMonitor(c, s.log); m != nil {
			s.health.list = append(s.health.list, m)
			s.health.names = append(s.health.names, c.Name)
		}
	}
	if len(s.health.list) == 0 {
		return
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, m := range s.health.list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.CheckOnce(context.Background())
		}()
	}
	wg.Wait()
	s.log.Debug("first round of health checks done", "clusters", len(s.health.list), "after", time.Since(start).Round(time.Millisecond))
}

// runHealthMonitors starts every monitor's goroutine, counting into the
// generation's stats.
func (s *Server) runHealthMonitors() {
	for _, m := range s.health.list {
		m.Start(s.stats)
	}
}

// stopHealthMonitors stops them; idempotent.
func (s *Server) stopHealthMonitors() {
	for _, m := range s.health.list {
		m.Stop()
	}
}
