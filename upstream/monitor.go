package upstream

import (
	"bufio"
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// MaxEjectionMultiplier caps how much an endpoint's ejection grows: the
// n-th ejection lasts base_ejection_time × min(n, MaxEjectionMultiplier),
// so a flapping endpoint is kept out longer, but never for ever.
const MaxEjectionMultiplier = 10

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

// Stop ends the monitor and waits for its goroutine (a round in flight is
// abandoned). It is idempotent, and a no-op before Start.
func (m *Monitor) Stop() {
	if m == nil || m.cancel == nil {
		return
	}
	m.cancel()
	<-m.done
}

// roundResult is one round's outcome per endpoint.
type roundResult []bool

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
		roundTimer.Reset(m.wait())
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

// resolution is one host name's new address, or why it has none.
type resolution struct {
	endpoint int
	addr     string
	err      error
}

// resolvesNames reports whether the cluster has endpoints given by host
// name to resolve again every dns_refresh.
func (c *Cluster) resolvesNames() bool {
	if c.dnsRefresh <= 0 {
		return false
	}
	for _, n := range c.names {
		if n != "" {
			return true
		}
	}
	return false
}

// resolveNames resolves every endpoint given by name (each bounded by
// ResolveTimeout), keeping an address of current when it is still among
// the answers. It runs off the monitor's goroutine.
func (c *Cluster) resolveNames(current []string) []resolution {
	var out []resolution
	for i, name := range c.names {
		if name == "" {
			continue
		}
		addr, err := resolveEndpoint(name, current[i])
		out = append(out, resolution{endpoint: i, addr: addr, err: err})
	}
	return out
}

// applyResolutions moves endpoints whose name resolves elsewhere now; a
// name that does not resolve keeps its last good address. It reports
// whether an address changed. An endpoint at a new address must pass a
// health check (when there are checks) before it takes traffic again.
func (m *Monitor) applyResolutions(res []resolution) bool {
	changed := false
	for _, r := range res {
		if m.st != nil {
			m.st.updateAttempt.Inc()
		}
		if r.err != nil {
			if m.st != nil {
				m.st.updateFailure.Inc()
			}
			m.log.Warn("endpoint name no longer resolves: keeping its last address", "endpoint", m.c.names[r.endpoint], "address", m.addrs[r.endpoint], "error", r.err)
			continue
		}
		if m.st != nil {
			m.st.updateSuccess.Inc()
		}
		i := r.endpoint
		if r.addr == m.addrs[i] {
			continue
		}
		m.log.Info("endpoint name resolves to a new address", "endpoint", m.c.names[i], "from", m.addrs[i], "to", r.addr)
		m.addrs[i] = r.addr
		h := &m.c.state.shared[i]
		h.consecutive5xx.Store(0)
		h.consecutiveConnectFail.Store(0)
		if m.hc != nil {
			m.healthy[i], m.known[i] = false, false
			m.successes[i], m.failures[i] = 0, 0
		}
		changed = true
	}
	return changed
}

// wait is the time to the next round: the interval and a jitter.
func (m *Monitor) wait() time.Duration {
	d := m.hc.Interval.D()
	if j := int64(d) * config.HealthCheckJitterPercent / 100; j > 0 {
		d += time.Duration(rand.Int64N(j))
	}
	return d
}

// round checks every endpoint at once (at addrs, the monitor's copy
// when the round started), each bounded by the timeout.
func (m *Monitor) round(ctx context.Context, addrs []string) roundResult {
	res := make(roundResult, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, m.hc.Timeout.D())
			defer cancel()
			res[i] = m.check(cctx, addr)
		}()
	}
	wg.Wait()
	return res
}

// check is one health check of addr: a TCP connect, or an HTTP/1.1 GET of
// the path whose status must be expected. It never obeys HTTP_PROXY: it
// speaks to the endpoint itself.
func (m *Monitor) check(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if m.hc.Path == "" {
		return true
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// Close the connection when ctx ends early (Stop), so the read below
	// does not outlive it.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "GET " + m.hc.Path + " HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: hotproxy-health-check\r\nConnection: close\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return slices.Contains(m.hc.ExpectedStatuses, resp.StatusCode)
}

// apply moves each endpoint's health by one round's results.
func (m *Monitor) apply(r roundResult) {
	for i, ok := range r {
		m.count(ok)
		was, known := m.healthy[i], m.known[i]
		m.known[i] = true
		if ok {
			m.failures[i] = 0
			m.successes[i]++
			if !was && (!known || m.successes[i] >= m.hc.HealthyThreshold) {
				m.healthy[i] = true
			}
		} else {
			m.successes[i] = 0
			m.failures[i]++
			if was && m.failures[i] >= m.hc.UnhealthyThreshold {
				m.healthy[i] = false
			}
		}
		if m.healthy[i] != was || !known {
			m.log.Info("endpoint health", "endpoint", m.addrs[i], "healthy", m.healthy[i], "first_check", !known)
		}
	}
}

func (m *Monitor) count(ok bool) {
	if m.st == nil {
		m.attempts++
		if ok {
			m.passes++
		} else {
			m.fails++
		}
		return
	}
	m.st.attempt.Inc()
	if ok {
		m.st.success.Inc()
	} else {
		m.st.failure.Inc()
	}
}

// ejectOutliers ejects every endpoint whose reported failures in a row
// reached a threshold, unless max_ejection_percent of the endpoints are
// ejected already (Envoy's rule: the check is made before each ejection).
// It reports whether anything changed.
func (m *Monitor) ejectOutliers(now time.Time) bool {
	st, od := m.c.state, m.od
	if od == nil {
		return false
	}
	n := len(m.ejected)
	changed := false
	for i := range n {
		h := &st.shared[i]
		hit := (st.consecutive5xx > 0 && h.consecutive5xx.Load() >= st.consecutive5xx) ||
			(st.consecutiveConnectFail > 0 && h.consecutiveConnectFail.Load() >= st.consecutiveConnectFail)
		if m.ejected[i] || !hit {
			continue
		}
		// Counted from zero again, whatever is decided.
		h.consecutive5xx.Store(0)
		h.consecutiveConnectFail.Store(0)
		if m.ejectedCount()*100 >= od.MaxEjectionPercent*n {
			if m.st != nil {
				m.st.ejectionsOverflow.Inc()
			}
			m.log.Warn("endpoint not ejected: max_ejection_percent reached", "endpoint", m.addrs[i], "max_ejection_percent", od.MaxEjectionPercent)
			continue
		}
		m.ejections[i]++
		d := od.BaseEjectionTime.D() * time.Duration(min(m.ejections[i], MaxEjectionMultiplier))
		m.ejected[i], m.until[i] = true, now.Add(d)
		changed = true
		if m.st != nil {
			m.st.ejectionsTotal.Inc()
		}
		m.log.Warn("endpoint ejected", "endpoint", m.addrs[i], "for", d, "ejections", m.ejections[i])
	}
	return changed
}

func (m *Monitor) ejectedCount() int {
	k := 0
	for _, e := range m.ejected {
		if e {
			k++
		}
	}
	return k
}

// unejectDue returns the endpoints whose ejection time is over.
func (m *Monitor) unejectDue(now time.Time) bool {
	changed := false
	for i, e := range m.ejected {
		if e && !now.Before(m.until[i]) {
			m.ejected[i] = false
			h := &m.c.state.shared[i]
			h.consecutive5xx.Store(0)
			h.consecutiveConnectFail.Store(0)
			changed = true
			m.log.Info("endpoint returned from ejection", "endpoint", m.addrs[i])
		}
	}
	return changed
}

func (m *Monitor) nextUneject() (time.Time, bool) {
	var next time.Time
	ok := false
	for i, e := range m.ejected {
		if e && (!ok || m.until[i].Before(next)) {
			next, ok = m.until[i], true
		}
	}
	return next, ok
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
