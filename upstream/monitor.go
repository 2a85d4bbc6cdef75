package upstream

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// Monitor is the main side's keeper of one cluster's endpoint health:
// it runs the active health checks and decides outlier ejections from the
// failures workers report, and publishes each change as a new HostSet.
// Workers never wait on it and it never runs on a worker (DESIGN §3).
//
// Its per-endpoint state belongs to its own goroutine (and, before Start,
// to the caller of CheckOnce).
type Monitor struct {
	c   *Cluster
	hc  *config.HealthCheck      // nil: no active checks
	od  *config.OutlierDetection // nil: no ejection
	log hclog.Logger

	addrs     []string // endpoint addresses now (see dns_refresh)
	healthy   []bool
	known     []bool // checked at least once
	successes []int  // passed checks in a row
	failures  []int  // failed checks in a row
	ejected   []bool
	until     []time.Time // end of the current ejection
	ejections []int       // times ejected, for the growing ejection time

	// Counts of the first round, made before the stats are bound.
	attempts, passes, fails uint64
	st                      *monitorStats

	// mu guards view, the per-endpoint picture the admin API reads.
	mu   sync.Mutex
	view []EndpointHealth

	cancel context.CancelFunc
	done   chan struct{}
	// firstRoundNow: run's first round of checks is at once
	// (StartChecking), not an interval after Start.
	firstRoundNow bool
}

type monitorStats struct {
	store                             *stats.Store
	attempt, success, failure         stats.CounterLane
	ejectionsTotal, ejectionsOverflow stats.CounterLane
	ejectionsActive                   stats.GaugeLane
	// Only for a cluster with names to resolve (Envoy's names).
	updateAttempt, updateSuccess, updateFailure stats.CounterLane
}

// NewMonitor returns the monitor of c, or nil when c has no health
// checks, no outlier detection and no host name to re-resolve (nothing
// changes, nothing to run).
func NewMonitor(c *Cluster, log hclog.Logger) *Monitor {
	if c.state == nil || (c.spec.HealthCheck == nil && c.spec.OutlierDetection == nil && !c.resolvesNames()) {
		return nil
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	n := len(c.Endpoints)
	m := &Monitor{
		c:         c,
		hc:        c.spec.HealthCheck,
		od:        c.spec.OutlierDetection,
		log:       log.Named("upstream").With("cluster", c.Name),
		addrs:     slices.Clone(c.state.hosts.Load().addrs),
		healthy:   make([]bool, n),
		known:     make([]bool, n),
		successes: make([]int, n),
		failures:  make([]int, n),
		ejected:   make([]bool, n),
		until:     make([]time.Time, n),
		ejections: make([]int, n),
	}
	for i := range m.healthy {
		m.healthy[i] = m.hc == nil
	}
	m.publish()
	c.state.monitor.Store(m)
	return m
}

// CheckOnce runs one round of health checks, every endpoint at once,
// bounded by the check timeout, and publishes the result. A generation
// calls it before it serves: an endpoint that passes is healthy at once
// (one pass is enough for an endpoint never checked, as in Envoy), one
// that fails is not routed to; if none passes, all are used (panic mode)
// so that a generation whose checks cannot get through still serves
// rather than failing every request.
func (m *Monitor) CheckOnce(ctx context.Context) {
	if m.hc == nil {
		return
	}
	m.apply(m.round(ctx, m.addrs))
	m.publish()
}

// Start runs the monitor on its own goroutine until Stop, counting into
// st (cluster.<name>.health_check.*, outlier_detection.*, lane 0).
func (m *Monitor) Start(st *stats.Store) {
	if st != nil {
		sc := "cluster." + m.c.Name + "."
		m.st = &monitorStats{
			store:             st,
			attempt:           st.Counter(sc + "health_check.attempt").Lane(0),
			success:           st.Counter(sc + "health_check.success").Lane(0),
			failure:           st.Counter(sc + "health_check.failure").Lane(0),
			ejectionsTotal:    st.Counter(sc + "outlier_detection.ejections_enforced_total").Lane(0),
			ejectionsOverflow: st.Counter(sc + "outlier_detection.ejections_overflow").Lane(0),
			ejectionsActive:   st.Gauge(sc+"outlier_detection.ejections_active", stats.GaugeNewest).Lane(0),
		}
		if m.c.resolvesNames() {
			m.st.updateAttempt = st.Counter(sc + "update_attempt").Lane(0)
			m.st.updateSuccess = st.Counter(sc + "update_success").Lane(0)
			m.st.updateFailure = st.Counter(sc + "update_failure").Lane(0)
		}
		m.st.attempt.Add(m.attempts)
		m.st.success.Add(m.passes)
		m.st.failure.Add(m.fails)
		m.publish()
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.done = make(chan struct{})
	go m.run(ctx)
}

// StartChecking is Start with the first round of health checks at once
// rather than an interval from now: for a cluster added while the
// generation serves (dynamic configuration), whose endpoints no CheckOnce
// has checked, so that the workers stop routing to a dead one within a
// round's timeout instead of an interval.
func (m *Monitor) StartChecking(st *stats.Store) {
	m.firstRoundNow = true
	m.Start(st)
}

// Stop ends the monitor and waits for its goroutine (a round in flight is
// abandoned). It is idempotent, and a no-op before Start.
func (m *Monitor) Stop() {
	if m == nil || m.cancel == nil {
		return
	}
	m.cancel()
	<-m.done
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.done)
	// A stopped timer: its channel never fires until Reset.
	stopped := func() *time.Timer {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}
	roundTimer, dnsTimer, unejectTimer := stopped(), stopped(), stopped()
	defer roundTimer.Stop()
	defer dnsTimer.Stop()
	defer unejectTimer.Stop()
	if m.hc != nil {
		if m.firstRoundNow {
			roundTimer.Reset(0)
		} else {
			roundTimer.Reset(m.wait())
		}
	}
	if m.c.resolvesNames() {
		dnsTimer.Reset(m.c.dnsRefresh)
	}
	results := make(chan roundResult, 1)
	resolved := make(chan []resolution, 1)
	roundInFlight, recheck := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-roundTimer.C:
			roundInFlight = true
			addrs := slices.Clone(m.addrs)
			go func() { results <- m.round(ctx, addrs) }()
		case r := <-results:
			if ctx.Err() != nil {
				return
			}
			roundInFlight = false
			m.apply(r)
			m.publish()
			if recheck {
				// An address changed during the round: check the
				// new one now.
				recheck = false
				roundTimer.Reset(0)
			} else {
				roundTimer.Reset(m.wait())
			}
		case <-dnsTimer.C:
			current := slices.Clone(m.addrs)
			go func() { resolved <- m.c.resolveNames(current) }()
		case res := <-resolved:
			if m.applyResolutions(res) {
				m.publish()
				if m.hc != nil {
					if roundInFlight {
						recheck = true
					} else {
						roundTimer.Reset(0)
					}
				}
			}
			dnsTimer.Reset(m.c.dnsRefresh)
		case <-m.c.state.wake:
			if m.ejectOutliers(time.Now()) {
				m.publish()
			}
		case <-unejectTimer.C:
			if m.unejectDue(time.Now()) {
				m.publish()
			}
		}
		if next, ok := m.nextUneject(); ok {
			unejectTimer.Reset(max(time.Until(next), 0))
		}
	}
}

// publish stores a new HostSet for the workers, the admin view and the
// membership gauges.
func (m *Monitor) publish() {
	hs := newHostSet(slices.Clone(m.addrs), slices.Clone(m.healthy), slices.Clone(m.ejected))
	m.c.hashing.prepare(hs.usable) // ring_hash, maglev: off the workers
	m.c.state.hosts.Store(hs)
	view := make([]EndpointHealth, len(m.healthy))
	for i := range view {
		eh := EndpointHealth{Address: m.addrs[i], Healthy: m.healthy[i], Ejected: m.ejected[i], Ejections: m.ejections[i]}
		switch {
		case m.hc == nil:
			eh.Check = CheckNone
		case !m.known[i]:
			eh.Check = CheckUnknown
		case m.healthy[i]:
			eh.Check = CheckHealthy
		default:
			eh.Check = CheckUnhealthy
		}
		if m.ejected[i] {
			eh.EjectedUntil = m.until[i]
		}
		view[i] = eh
	}
	m.mu.Lock()
	m.view = view
	m.mu.Unlock()
	if m.st != nil {
		m.c.SetMembership(m.st.store)
		m.st.ejectionsActive.Set(int64(m.ejectedCount()))
	}
}

// Check results an endpoint can have, as the admin API shows them.
const (
	CheckNone      = "no_check" // the cluster has no health checks
	CheckUnknown   = "unknown"  // not checked yet
	CheckHealthy   = "healthy"
	CheckUnhealthy = "unhealthy"
)

// EndpointHealth is what the monitor knows of one endpoint.
type EndpointHealth struct {
	Address      string
	Check        string // CheckNone, CheckUnknown, CheckHealthy or CheckUnhealthy
	Healthy      bool
	Ejected      bool
	EjectedUntil time.Time
	Ejections    int
}

// Endpoints returns the monitor's view of every endpoint (for the admin
// API).
func (m *Monitor) Endpoints() []EndpointHealth {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.view)
}
