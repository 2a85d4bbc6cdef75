package workers

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/stats"
)

// The workers' side of the overload manager (server/overload.go, DESIGN
// §3d). The manager decides on the main goroutine; what it asks of the
// workers reaches each one as an immutable httpfront.Overload behind an atomic
// pointer of the worker's own, loaded once at accept and once at request
// start. nil, the common case, costs that one load and nothing else: no
// lock, no lookup by name.

// OverloadState is what the overload manager asks of the workers.
type OverloadState struct {
	// StopAccepting refuses new connections: in the kernel, counted by
	// the steering program, on a listener where it is loaded; else
	// closed at accept, counted (StopAcceptingModes says which).
	StopAccepting bool
	// RefuseRequests answers new requests 503 with Retry-After.
	RefuseRequests bool
	// DisableKeepAlive closes HTTP/1.1 connections after their response
	// and sends HTTP/2 ones a GOAWAY.
	DisableKeepAlive bool
	// TimeoutPercent scales the HTTP header and idle timeouts (1..100;
	// 0 or 100: as configured).
	TimeoutPercent int
	// RetryAfter is the Retry-After of a refused request (rounded up to
	// whole seconds, at least 1).
	RetryAfter time.Duration
}

// active reports whether st asks anything of the workers.
func (st OverloadState) active() bool {
	return st.StopAccepting || st.RefuseRequests || st.DisableKeepAlive || (st.TimeoutPercent > 0 && st.TimeoutPercent < 100)
}

// overloadStats are the workers' shed counts, one lane per worker (w+1).
//
//	overload.shed_total                 every connection or request shed
//	overload.stop_accepting.closed      connections closed at accept
//	overload.stop_accepting.refused     connections the steering program refused in the kernel
//	overload.refuse_requests.refused    requests answered 503
//	overload.reset_connections.reset    connections reset (ResetBiggest)
//
// The kernel's refusals are counted by the program (steering.Group
// ShedRefused) and reach the stats on lane 0 as deltas
// (countKernelRefusals): once per overload pass and per migratedPoll.
type overloadStats struct {
	shed          *stats.Counter
	closed        *stats.Counter
	kernelRefused *stats.Counter
	refused       *stats.Counter
	reset         *stats.Counter
}

// overloadStatsOf returns the Manager's overload counters, registering
// them on first use.
func (m *Manager) overloadStatsOf() *overloadStats {
	if p := m.overloadCounters.Load(); p != nil {
		return p
	}
	p := &overloadStats{
		shed:          m.stats.Counter("overload.shed_total"),
		closed:        m.stats.Counter("overload.stop_accepting.closed"),
		kernelRefused: m.stats.Counter("overload.stop_accepting.refused"),
		refused:       m.stats.Counter("overload.refuse_requests.refused"),
		reset:         m.stats.Counter("overload.reset_connections.reset"),
	}
	if m.overloadCounters.CompareAndSwap(nil, p) {
		return p
	}
	return m.overloadCounters.Load()
}

// SetOverload publishes st to every worker. Called by the overload
// manager (one goroutine); a connection or request that has already
// passed its check is not affected, the next one is.
func (m *Manager) SetOverload(st OverloadState) {
	m.overloadStatsOf() // registered before the first shed, so a reader sees 0
	m.mu.Lock()
	m.overload = &st // for the listeners UpdateListeners adds later
	all := append(slices.Clip(m.listeners), m.retiring...)
	slots := m.nextIdx
	m.mu.Unlock()
	var v *httpfront.Overload
	if st.active() {
		v = &httpfront.Overload{StopAccepting: st.StopAccepting, RefuseRequests: st.RefuseRequests, DisableKeepAlive: st.DisableKeepAlive}
		v.Refusal, v.RetryAfter = httpfront.NewOverloadRefusal(st.RetryAfter)
		if p := st.TimeoutPercent; p > 0 && p < 100 {
			v.Settings = make([]*httpfront.Settings, slots)
			for _, ml := range all {
				if ml.h1 == nil {
					continue
				}
				v.Settings[ml.idx] = httpfront.ShrunkSettings(ml.h1, p)
			}
		}
	}
	for _, wk := range m.workers {
		wk.front.Overload.Store(v)
	}
	// Where the steering program is loaded it refuses in the kernel;
	// the check at accept still closes what was queued before.
	for _, ml := range all {
		if ml.steer != nil {
			ml.steer.Shed(st.StopAccepting)
		}
	}
	m.countKernelRefusals()
}

// Modes of stop_accepting, by listener (StopAcceptingModes).
const (
	// StopAcceptingKernel: the steering program refuses new
	// connections in the kernel (the client's connect fails with
	// ECONNREFUSED), counted in overload.stop_accepting.refused.
	StopAcceptingKernel = "kernel"
	// StopAcceptingAccept: new connections are accepted and reset at
	// once, counted in overload.stop_accepting.closed (no program:
	// balance = "kernel", no CAP_BPF, one shared socket, not Linux).
	StopAcceptingAccept = "accept"
)

// StopAcceptingModes returns, by listener name, how stop_accepting
// refuses new connections there: StopAcceptingKernel or
// StopAcceptingAccept.
func (m *Manager) StopAcceptingModes() map[string]string {
	current := m.currentListeners()
	modes := make(map[string]string, len(current))
	for _, ml := range current {
		modes[ml.name] = StopAcceptingAccept
		if ml.steer != nil {
			modes[ml.name] = StopAcceptingKernel
		}
	}
	return modes
}

// CountKernelRefusals brings what the steering programs refused for
// stop_accepting into overload.stop_accepting.refused and
// overload.shed_total; the overload manager calls it once per pass.
func (m *Manager) CountKernelRefusals() { m.countKernelRefusals() }

// countKernelRefusals adds, per listener, what its program refused since
// the last call. Safe from several goroutines at once: the program's
// count only grows, and each delta is claimed by one caller (the
// compare-and-swap), so no refusal is lost or counted twice however often
// stop_accepting turns on and off.
func (m *Manager) countKernelRefusals() {
	oc := m.overloadCounters.Load()
	if oc == nil {
		return // never SetOverload: nothing shed, no overload stats
	}
	for _, sl := range m.steeredListeners() {
		seen := &sl.ml.kernelSeen
		for {
			now, before := sl.g.ShedRefused(), seen.Load()
			if now <= before {
				break
			}
			if seen.CompareAndSwap(before, now) {
				oc.kernelRefused.Lane(0).Add(now - before)
				oc.shed.Lane(0).Add(now - before)
				break
			}
		}
	}
}

// overloadClosesAccepted is the accept-time check: with stop_accepting,
// c is closed at once and counted, and true says so. Where the steering
// program refuses in the kernel, this closes only what was queued before
// it started.
func (a *acceptor) overloadClosesAccepted(c acceptedConn) bool {
	v := a.wk.front.Overload.Load()
	if v == nil || !v.StopAccepting {
		return false
	}
	c.SetLinger(0) // a reset: the client learns now and retries elsewhere
	c.Close()
	oc := a.m.overloadStatsOf()
	oc.closed.Lane(a.wk.id + 1).Inc()
	oc.shed.Lane(a.wk.id + 1).Inc()
	return true
}

// AdvanceOverloadPass counts one overload-manager pass: the clock by
// which ResetBiggest tells how long a connection has held its buffers.
func (m *Manager) AdvanceOverloadPass() { m.overloadPass.Add(1) }

// ResetBiggest resets (RST) at most max of the HTTP client connections
// that hold the most buffered bytes, largest first; among equals, those
// on their first request first (a flood holds its connections on their
// first request; a keep-alive client that has been served before is the
// last to go), then the longest held. Only connections that have held
// their buffers for at least minPasses overload passes are candidates, so
// that a quick request is never cut. It returns how many it reset. Called on the main
// goroutine (it counts on lane 0).
func (m *Manager) ResetBiggest(max, minPasses int) int {
	if max <= 0 {
		return 0
	}
	now := m.overloadPass.Load() + 1
	type candidate struct {
		cc       *httpfront.Conn
		bytes    int64
		requests int64
		since    int64
	}
	var cands []candidate
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			cc, ok := c.(*httpfront.Conn)
			if !ok {
				continue
			}
			since, bytes, requests, idle := cc.HeldBuffers()
			if since == 0 || now-since < int64(minPasses) || idle {
				continue
			}
			cands = append(cands, candidate{cc, bytes, requests, since})
		}
		wk.conns.mu.Unlock()
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.bytes != b.bytes {
			return cmp.Compare(b.bytes, a.bytes)
		}
		if a.requests != b.requests {
			return cmp.Compare(a.requests, b.requests)
		}
		return cmp.Compare(a.since, b.since)
	})
	oc := m.overloadStatsOf()
	n := 0
	for _, c := range cands[:min(len(cands), max)] {
		c.cc.Reset()
		oc.reset.Lane(0).Inc()
		oc.shed.Lane(0).Inc()
		n++
	}
	return n
}

// CloseIdleShrunk closes the HTTP connections idle between requests for
// longer than percent of their listener's idle_timeout (shrink_timeouts:
// connections already waiting keep the timeout they started waiting
// with), and returns how many.
func (m *Manager) CloseIdleShrunk(percent int) int {
	now := monotime()
	var idle []*httpfront.Conn
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			cc, ok := c.(*httpfront.Conn)
			if !ok {
				continue
			}
			base := cc.ListenerSettings()
			if base != nil && cc.IdleFor(now) > base.IdleTimeout*time.Duration(percent)/100 && cc.IdleFor(now) > 0 {
				idle = append(idle, cc)
			}
		}
		wk.conns.mu.Unlock()
	}
	for _, cc := range idle {
		cc.Close()
	}
	return len(idle)
}

// OpenConnections returns the open client connections of all listeners
// and the server-wide bound on them (0: none), for the connections
// monitor.
func (m *Manager) OpenConnections() (open, bound int64) {
	return m.budget.openTotal(), m.budget.max
}

// overloadFields are the Manager's overload state (embedded in Manager).
type overloadFields struct {
	// overloadPass counts overload-manager passes (clientConn.heldSince
	// stores it plus one: 0 there is "not holding").
	overloadPass     atomic.Int64
	overloadCounters atomic.Pointer[overloadStats]
}
