package workers

import (
	"sync/atomic"
	"time"
)

// Liveness of the accept loops, for the watchdog (server/watchdog.go).
// Each accept loop stores the time in its own word at every iteration (a
// store, no lock, never per request), and an idle loop wakes for it: its
// wait for a connection is bounded by the heartbeat interval (a listener
// deadline, the same wake-up a drain uses), so a loop that is stuck, and
// only one that is, lets its word age.

// heartbeat is one accept loop's word: the monotime of its last
// iteration, alone on its cache line with deadlineMoves, how many times
// beat has moved the listener's deadline (a test reads it).
type heartbeat struct {
	at            atomic.Int64
	deadlineMoves atomic.Int64
	_             [48]byte
}

// loopBeat is one accept loop's heartbeat and the worker it belongs to.
type loopBeat struct {
	worker int
	hb     *heartbeat
	ml     *mlistener // the loop's listener: its beat ends with its accepting
}

// beat stores a's heartbeat and bounds its next wait for a connection, so
// that it stores the next one within its interval even if nothing
// arrives. Once accepting stops, the deadline is the drain's.
//
// The deadline moves only once less than half the interval is left of
// it: a loop accepting many connections re-arms its timer about twice
// per interval, not once per connection (a clock read and a timer reset
// each). The bound holds: the deadline was set at or before the last
// heartbeat, one interval ahead, so a loop that accepts nothing more
// wakes within an interval of its last heartbeat.
func (a *acceptor) beat() {
	if a.hb == nil || a.ml.acceptStopped() {
		return
	}
	now := monotime()
	a.hb.at.Store(now)
	if a.beatDeadline-now > int64(a.beatEvery/2) {
		return
	}
	a.beatDeadline = now + int64(a.beatEvery)
	a.hb.deadlineMoves.Add(1)
	a.s.setAcceptDeadline(time.Now().Add(a.beatEvery))
	if a.ml.acceptStopped() {
		// stopListeners's wake-up (a deadline in the past) may have
		// come between the check and the deadline above: restore it.
		a.s.setAcceptDeadline(time.Now())
	}
}

// WorkerHeartbeatAges returns, for every worker, how long ago the least
// recent of its accept loops stored a heartbeat, appended to ages[:0]; nil
// when no heartbeat is kept (Options.HeartbeatInterval is 0), before
// Start, and once accepting has stopped (a drain: the loops end). The
// loops of a listener that drains alone (UpdateListeners) no longer count
// once it stops accepting.
func (m *Manager) WorkerHeartbeatAges(ages []time.Duration) []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started || m.stopped || len(m.beats) == 0 {
		return nil
	}
	ages = ages[:0]
	for range m.n {
		ages = append(ages, 0)
	}
	now := monotime()
	for _, b := range m.beats {
		if b.ml.stopped {
			continue
		}
		ages[b.worker] = max(ages[b.worker], time.Duration(now-b.hb.at.Load()))
	}
	return ages
}

// loops is how many of n workers accept on s: one for a worker's own
// socket, every one for a shared socket.
func (s *socket) loops(n int) int {
	if s.owner >= 0 {
		return 1
	}
	return max(1, n)
}
