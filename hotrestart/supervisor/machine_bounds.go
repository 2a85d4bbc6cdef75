package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The bound on generations alive at once (hot_restart.max_draining_generations):
// reloads may come faster than generations drain. See machine.go.

// maxDraining is hot_restart.max_draining_generations (at least 1).
func (m *machine) maxDraining() int { return max(1, m.cfg.HotRestart.MaxDrainingGenerations) }

// aliveLimit bounds the generations alive at once: the draining ones, the
// serving one, and one starting.
func (m *machine) aliveLimit() int { return m.maxDraining() + 2 }

// roomToStart reports whether one more generation may start without
// exceeding aliveLimit. If not, it hurries the oldest draining generations
// that make room once they exit (a reap wakes the loop, and tick asks
// again); hurried ones are already on their way out.
func (m *machine) roomToStart() bool {
	excess := len(m.gens) + 1 - m.aliveLimit()
	if excess <= 0 {
		return true
	}
	var draining []*generation
	for _, g := range m.gens {
		if g.state == StateDraining {
			if g.hurried {
				excess--
				continue
			}
			draining = append(draining, g)
		}
	}
	slices.SortFunc(draining, func(a, b *generation) int { return a.epoch - b.epoch })
	for _, g := range draining[:min(max(0, excess), len(draining))] {
		m.hurry(g, "a reload waits for room")
	}
	m.log.Debug("waiting for a hurried generation to exit before starting the next", "alive", len(m.gens), "limit", m.aliveLimit())
	return false
}

// hurry tells a draining generation to stop now (SIGTERM: it commits at
// once if it had not, and gives its in-flight requests drain_time).
func (m *machine) hurry(g *generation, why string) {
	m.log.Info("hurrying a draining generation", "epoch", g.epoch, "pid", g.pid, "why", why,
		"max_draining_generations", m.maxDraining())
	g.hurried = true
	g.hurriedAt = m.now()
	m.procs.signal(g, SignalTerm)
}

// waiting says what a reload that has not started its generation yet
// waits for, and for how long at most: "" when none waits for room. A
// reload past max_draining_generations waits for a hurried generation to
// exit, which can take a whole drain_time; `hotproxy reload` prints this
// rather than saying nothing for that long.
func (m *machine) waiting() string {
	if m.stopping || m.op == nil || m.op.gen != nil || len(m.gens)+1 <= m.aliveLimit() {
		return ""
	}
	now := m.now()
	var hurried []string
	for _, g := range m.gens {
		switch {
		case g.hurried && g.hurriedAt.IsZero(): // hurried before a re-execution: when is not kept
			hurried = append(hurried, fmt.Sprintf("epoch %d (pid %d, told to stop)", g.epoch, g.pid))
		case g.hurried:
			hurried = append(hurried, fmt.Sprintf("epoch %d (pid %d, told to stop %s ago)", g.epoch, g.pid, now.Sub(g.hurriedAt).Round(100*time.Millisecond)))
		}
	}
	what := "a draining generation has been told to stop and has exited"
	if len(hurried) > 0 {
		what = strings.Join(hurried, ", ") + " has exited"
	}
	return fmt.Sprintf("%d generations alive, the bound for hot_restart.max_draining_generations = %d (%d draining + the serving one + the one starting): the next generation starts when %s; a generation told to stop drains for up to server.drain_time (%s), its TCP connections up to server.parent_shutdown_time (%s)",
		len(m.gens), m.maxDraining(), m.maxDraining(), what, m.cfg.Server.DrainTime.D(), m.cfg.Server.ParentShutdownTime.D())
}

// hurryOldestDraining keeps the draining generations within
// max_draining_generations: past it, the oldest are told to stop (SIGTERM:
// a generation that drains already commits at once, if it had not, and
// gives its in-flight requests drain_time). The newest draining one, the
// rollback target, is hurried last, and a serving one never.
func (m *machine) hurryOldestDraining() {
	limit := m.maxDraining()
	var draining []*generation
	for _, g := range m.gens {
		if g.state == StateDraining && !g.hurried {
			draining = append(draining, g)
		}
	}
	slices.SortFunc(draining, func(a, b *generation) int { return a.epoch - b.epoch })
	for _, g := range draining[:max(0, len(draining)-limit)] {
		m.hurry(g, "too many generations drain at once")
	}
}
