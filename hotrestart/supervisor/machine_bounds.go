package supervisor

import "slices"

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
	m.procs.signal(g, SignalTerm)
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
