package supervisor

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// What the machine does with what happens to its generations: readiness,
// exits, the end of a reload. See machine.go.

// onReady handles a generation's readiness line (or its absence).
func (m *machine) onReady(msg readyMsg) {
	g := msg.gen
	if msg.err == nil && strings.HasPrefix(msg.line, "READY") && !g.exited {
		prev := m.serving()
		g.state = StateServing
		g.readyAt = m.now()
		if prev != nil {
			m.answerCommitWaiters(prev, ReloadResult{OK: true, Committed: true, Epoch: prev.epoch, PID: prev.pid,
				ServingEpoch: g.epoch, ServingPID: g.pid})
			prev.state = StateDraining
			prev.drainingSince = g.readyAt
			if prev.epoch != g.epoch-1 {
				// prev serves again after a rollback that happened while
				// g started from the generation that died: g did not
				// take over from prev, so nobody told prev to drain.
				m.log.Warn("the new generation took over from one that died since; stopping the one that had rolled back",
					"epoch", prev.epoch, "pid", prev.pid)
				m.hurry(prev, "the new generation did not take over from it")
			}
		}
		m.log.Info("generation serves", "epoch", g.epoch, "pid", g.pid)
		m.releaseHeld(g)
		m.killWedged(g)
		m.hurryOldestDraining()
		m.finishOp(g, "")
		return
	}
	var reason string
	switch {
	case msg.err == nil && strings.HasPrefix(msg.line, "FAILED"):
		reason = strings.TrimSpace(strings.TrimPrefix(msg.line, "FAILED"))
	case msg.err == nil && strings.HasPrefix(msg.line, "READY"):
		reason = "exited right after it was ready (" + g.exitStatus + ")"
	case errors.Is(msg.err, os.ErrDeadlineExceeded):
		reason = fmt.Sprintf("not ready within %s", m.readyTimeout())
	case msg.err != nil && g.exited:
		reason = "exited before it was ready (" + g.exitStatus + ")"
	case msg.err != nil:
		reason = "closed its readiness pipe without a word"
	default:
		reason = fmt.Sprintf("said %q on its readiness pipe", msg.line)
	}
	if reason == "" {
		reason = "failed"
	}
	if g.parent == parentKept {
		m.dropKept("the generation started on them failed; the next one starts cold")
	}
	if !g.exited {
		// It never served: nothing to drain. Kill it; it stays listed as
		// failed until it is reaped.
		g.state = StateFailed
		m.procs.signal(g, SignalKill)
	} else {
		m.remove(g)
	}
	if cur := m.serving(); cur != nil {
		m.log.Error("generation failed to start; the serving generation is untouched", "epoch", g.epoch, "pid", g.pid, "reason", reason,
			"serving_epoch", cur.epoch, "serving_pid", cur.pid)
	} else {
		m.log.Error("generation failed to start; no generation serves", "epoch", g.epoch, "pid", g.pid, "reason", reason)
	}
	m.finishOp(nil, fmt.Sprintf("epoch %d (pid %d): %s", g.epoch, g.pid, reason))
}

// finishOp ends the operation in progress with the generation now serving
// (nil on failure), answers its waiters and promotes the queued one.
func (m *machine) finishOp(g *generation, failure string) {
	op := m.op
	m.op = nil
	epoch := m.lastEpoch
	if op != nil && op.gen != nil {
		epoch = op.gen.epoch
	}
	res := ReloadResult{OK: g != nil, Epoch: epoch, Error: failure, ServingEpoch: -1}
	if g != nil {
		res.PID = g.pid
	}
	if cur := m.serving(); cur != nil {
		res.ServingEpoch, res.ServingPID = cur.epoch, cur.pid
	}
	switch {
	case op != nil && (op.initial || op.crash):
		// Not a reload: counted by neither.
	case g != nil:
		m.reloads++
		g.countedReload = true
	default:
		m.failed++
	}
	if g == nil {
		m.lastFailure = &Failure{Epoch: epoch, Reason: failure, At: m.now()}
		if op != nil && op.gen != nil {
			m.lastFailure.PID = op.gen.pid
		}
	}
	switch {
	case g != nil:
		m.procs.notify("READY=1", statusLine(m.summary()))
	case res.ServingPID != 0:
		m.procs.notify("READY=1", statusLine(fmt.Sprintf("reload to epoch %d failed: %s; %s", epoch, failure, m.summary())))
	default:
		m.procs.notify(statusLine(fmt.Sprintf("epoch %d failed: %s; no generation serves", epoch, failure)))
	}
	if op != nil {
		for _, w := range op.waiters {
			if w.commit && g != nil {
				g.commitWaiters = append(g.commitWaiters, w.reply)
				continue
			}
			w.reply <- res
		}
	}
	if m.stopping {
		return
	}
	if op != nil && op.initial && g == nil {
		// The first generation is epoch 0, or past it with --take-over.
		m.exitErr = fmt.Errorf("epoch %d did not start: %s", epoch, failure)
		m.beginStop(fmt.Sprintf("epoch %d did not start", epoch))
		return
	}
	if m.queued != nil && !(m.reloadsDeferred && len(m.queued.waiters) == 0) {
		q := m.queued
		m.queued = nil
		m.beginOp(q)
		return
	}
	if m.serving() == nil {
		// Nothing serves: the service must come back.
		m.crashRestart("no generation serves after: " + failure)
	}
}

// crashRestart schedules a cold start of the next epoch with back-off, or
// gives up after MaxCrashRestarts within CrashWindow.
func (m *machine) crashRestart(why string) {
	now := m.now()
	kept := m.crashes[:0]
	for _, t := range m.crashes {
		if now.Sub(t) < CrashWindow {
			kept = append(kept, t)
		}
	}
	m.crashes = append(kept, now)
	if len(m.crashes) > MaxCrashRestarts {
		m.exitErr = fmt.Errorf("giving up: %d restarts within %s (%s)", len(m.crashes)-1, CrashWindow, why)
		m.log.Error("the serving generation keeps failing; giving up", "error", m.exitErr)
		m.procs.notify(statusLine(m.exitErr.Error()))
		m.beginStop("giving up")
		return
	}
	backoff := 100 * time.Millisecond << (len(m.crashes) - 1)
	m.log.Warn("no generation serves; starting one cold", "reason", why, "in", backoff)
	m.beginOp(&reloadOp{crash: true})
	m.startAt = now.Add(backoff)
}

// onExit handles a generation that was reaped.
func (m *machine) onExit(g *generation, e exit) {
	switch g.state {
	case StateStarting:
		// Its readiness reader reports (the pipe closed with it).
		g.exited, g.exitStatus = true, e.how
		m.log.Debug("starting generation exited", "epoch", g.epoch, "pid", g.pid, "status", e.how)
		return
	case StateFailed:
		m.log.Debug("failed generation reaped", "epoch", g.epoch, "pid", g.pid, "status", e.how)
	case StateDraining:
		m.log.Info("drained generation exited", "epoch", g.epoch, "pid", g.pid, "status", e.how)
	case StateStopping:
		m.log.Info("generation stopped", "epoch", g.epoch, "pid", g.pid, "status", e.how)
		if !e.clean && !m.killed {
			m.exitErr = errors.Join(m.exitErr, fmt.Errorf("epoch %d (pid %d) stopped with %s", g.epoch, g.pid, e.how))
		}
	case StateServing:
		m.remove(g)
		m.onServingDied(g, e)
		return
	case StateWedged:
		m.log.Info("wedged generation is gone", "epoch", g.epoch, "pid", g.pid, "status", e.how)
	}
	m.remove(g)
	if m.quitWhenEmpty && len(m.gens) == 0 && m.op == nil {
		m.beginStop("nothing left to run")
	}
}

// onServingDied: the serving generation exited without being asked. If it
// died within its commit window, its parent resumes serving by itself (the
// contract of serve); otherwise a new generation is started cold.
func (m *machine) onServingDied(g *generation, e exit) {
	var parent *generation
	for _, d := range m.gens {
		if d.state == StateDraining && !d.hurried && d.epoch < g.epoch &&
			m.now().Sub(d.drainingSince) <= m.cfg.HotRestart.CommitWindow.D()+time.Second &&
			(parent == nil || d.epoch > parent.epoch) {
			parent = d
		}
	}
	if e.clean && parent == nil && m.op == nil {
		// Exit status 0 is a drain this supervisor did not ask for: POST
		// /quitquitquit, or a hand-over to a generation it did not start
		// (another container of the pod, `supervise --take-over`). Not a
		// crash: nothing is restarted, and once nothing is left to run,
		// the supervisor exits 0.
		m.log.Info("the serving generation drained and exited by itself; not restarting it", "epoch", g.epoch, "pid", g.pid)
		m.procs.notify(statusLine(fmt.Sprintf("epoch %d (pid %d) drained and exited by itself; %s", g.epoch, g.pid, m.summary())))
		m.quitWhenEmpty = true
		if len(m.gens) == 0 {
			m.beginStop("nothing left to run")
		}
		return
	}
	reason := fmt.Sprintf("serving generation epoch %d (pid %d) died unexpectedly: %s", g.epoch, g.pid, e.how)
	m.lastFailure = &Failure{Epoch: g.epoch, PID: g.pid, Reason: reason, At: m.now()}
	if len(g.commitWaiters) > 0 {
		res := ReloadResult{Epoch: g.epoch, PID: g.pid, ServingEpoch: -1,
			Error: fmt.Sprintf("epoch %d (pid %d) died within its commit window: %s", g.epoch, g.pid, e.how)}
		if parent != nil {
			res.ServingEpoch, res.ServingPID = parent.epoch, parent.pid
			res.Error += fmt.Sprintf("; rolled back to epoch %d", parent.epoch)
		}
		m.answerCommitWaiters(g, res)
	}
	if parent != nil {
		// A rolled-back reload failed: it is counted once, as failed,
		// not as ok (when it served) and failed.
		if g.countedReload {
			m.reloads--
			g.countedReload = false
		}
		m.failed++
		parent.state = StateServing
		parent.drainingSince = time.Time{}
		m.log.Error("rolled back: the previous generation serves again", "reason", reason, "epoch", parent.epoch, "pid", parent.pid)
		m.procs.notify(statusLine(fmt.Sprintf("rolled back: %s; %s", reason, m.summary())))
		return
	}
	m.log.Error(reason)
	if m.op != nil {
		// A reload in progress will find nothing to take over from; its
		// failure leads to a cold start.
		return
	}
	m.crashRestart(reason)
}

// onWedged: the serving generation's heartbeat stopped (age, for
// watchdog.supervisor_timeout). It is left alone — its workers may still
// serve, and it holds connections in flight — while the next generation
// starts as after a crash (on the kept sockets, so nothing queued is
// lost); it is SIGKILLed once that one serves (killWedged).
func (m *machine) onWedged(g *generation, age time.Duration) {
	if g.state != StateServing || m.stopping {
		return
	}
	g.state = StateWedged
	reason := fmt.Sprintf("serving generation epoch %d (pid %d) is wedged: no heartbeat for %s (watchdog.supervisor_timeout %s)",
		g.epoch, g.pid, age.Round(time.Millisecond), m.cfg.Watchdog.SupervisorTimeout.D())
	m.lastFailure = &Failure{Epoch: g.epoch, PID: g.pid, Reason: reason, At: m.now()}
	m.answerCommitWaiters(g, ReloadResult{Epoch: g.epoch, PID: g.pid, ServingEpoch: -1, Error: reason})
	m.log.Error(reason + "; starting the next generation, and killing this one once that one serves")
	m.procs.notify(statusLine(reason))
	if m.op != nil {
		// A reload in progress took over from it already, or will find
		// nothing serving; either way it replaces it.
		return
	}
	m.crashRestart(reason)
}

// killWedged SIGKILLs the wedged generations: g serves in their place.
func (m *machine) killWedged(g *generation) {
	for _, w := range m.gens {
		if w.state == StateWedged {
			m.log.Warn("killing the wedged generation: its successor serves", "epoch", w.epoch, "pid", w.pid,
				"successor_epoch", g.epoch, "successor_pid", g.pid)
			m.procs.signal(w, SignalKill)
		}
	}
}

// answerCommitWaiters answers whoever waits for g's commit with res.
func (m *machine) answerCommitWaiters(g *generation, res ReloadResult) {
	for _, w := range g.commitWaiters {
		w <- res
	}
	g.commitWaiters = nil
}

// answerCommitted answers the commit waiters of the serving generation once
// it has served for the commit window, and returns when it wants to look
// again (zero: nobody waits).
func (m *machine) answerCommitted() time.Time {
	g := m.serving()
	if g == nil || len(g.commitWaiters) == 0 {
		return time.Time{}
	}
	// The same second of slack as a rollback's detection: the previous
	// generation commits on its own clock.
	at := g.readyAt.Add(m.cfg.HotRestart.CommitWindow.D() + time.Second)
	if m.now().Before(at) {
		return at
	}
	m.answerCommitWaiters(g, ReloadResult{OK: true, Committed: true, Epoch: g.epoch, PID: g.pid, ServingEpoch: g.epoch, ServingPID: g.pid})
	return time.Time{}
}

// expireDraining kills a draining generation that outlived its bound
// (it should exit by itself within parent_shutdown_time).
func (m *machine) expireDraining() {
	bound := m.cfg.HotRestart.CommitWindow.D() + m.stopBound()
	for _, g := range m.gens {
		if g.state == StateDraining && m.now().Sub(g.drainingSince) > bound {
			m.log.Warn("draining generation outlived parent_shutdown_time; killing it", "epoch", g.epoch, "pid", g.pid)
			m.procs.signal(g, SignalKill)
			g.drainingSince = m.now() // once per bound
		}
	}
}
