package workers

import (
	"time"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// The park sweep. An idle HTTP/1.1 keep-alive connection of a listener
// with park_idle_connections waits for its next request in its own
// goroutine first; once it has been idle for the park grace
// (httpfront.ParkIdleAfter) the sweep asks it to park (AskToPark: a read
// deadline in the past ends its wait), and it gives its goroutine back
// and waits in the worker's idle poller. A connection whose client sends
// within the grace never touches the poller: no system call and no
// hand-over per keep-alive request, as without parking; one that stays
// idle parks between one and two graces after its last response (the
// sweep runs every grace).
//
// The sweep runs on the reclaimer's goroutine, never on a request's. It
// reads two atomics of every connection of every worker under that
// worker's set's lock (the drain's closeIdle walks the set the same way)
// and asks outside it: an estimated 10 ns per connection, every grace.

// sweepIdleToPark asks every connection that has waited idle in its
// goroutine for the park grace to park. It returns how many it asked.
func (m *Manager) sweepIdleToPark() int {
	now := monotime()
	asked := 0
	for _, wk := range m.workers {
		asked += wk.conns.askIdleToPark(now, m.parkIdleAfter, &wk.parkDue)
	}
	return asked
}

// askIdleToPark asks the set's connections that are ParkDue to park;
// due is the sweep's own slice, kept between sweeps so that a sweep
// allocates nothing once it has grown.
func (s *connSet) askIdleToPark(now int64, grace time.Duration, due *[]*httpfront.Conn) int {
	d := (*due)[:0]
	s.mu.Lock()
	for c := range s.m {
		if cc, ok := c.(*httpfront.Conn); ok && cc.ParkDue(now, grace) {
			d = append(d, cc)
		}
	}
	s.mu.Unlock()
	asked := 0
	for i, cc := range d {
		if cc.AskToPark(grace) {
			asked++
		}
		d[i] = nil // hold no connection until the next sweep
	}
	*due = d[:0]
	return asked
}
