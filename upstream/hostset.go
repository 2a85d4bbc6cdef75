package upstream

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hotproxy/hotproxy/config"
)

// HostSet is an immutable picture of which endpoints of a cluster may take
// traffic. The cluster's Monitor (main side) builds a new one whenever an
// endpoint's health or ejection changes and publishes it with one atomic
// store; balancers load it once per pick, without a lock (DESIGN §3, RCU).
type HostSet struct {
	// addrs[i] is endpoint i's address ("ip:port") now: a host name is
	// re-resolved every dns_refresh, keeping the last good address.
	addrs []string
	// usable lists the endpoint indices traffic goes to: the healthy,
	// not ejected ones, or every endpoint in panic mode.
	usable []int32
	// panic: no endpoint is healthy and not ejected, so all are used
	// rather than none (Envoy's panic mode).
	panic bool
	// healthy[i]: endpoint i passed its active checks (always true
	// without health checks); ejected[i]: outlier detection ejected it.
	healthy []bool
	ejected []bool
}

// newHostSet builds the set for the given health and ejection of every
// endpoint.
func newHostSet(addrs []string, healthy, ejected []bool) *HostSet {
	hs := &HostSet{addrs: addrs, healthy: healthy, ejected: ejected}
	for i := range healthy {
		if healthy[i] && !ejected[i] {
			hs.usable = append(hs.usable, int32(i))
		}
	}
	if len(hs.usable) == 0 && len(healthy) > 0 {
		hs.panic = true
		for i := range healthy {
			hs.usable = append(hs.usable, int32(i))
		}
	}
	return hs
}

// Usable is the number of endpoints that are healthy and not ejected
// (0 in panic mode).
func (hs *HostSet) Usable() int {
	if hs.panic {
		return 0
	}
	return len(hs.usable)
}

// Panic reports whether no endpoint is usable, so that all are used.
func (hs *HostSet) Panic() bool { return hs.panic }

// sharedHost is what the workers of a generation share about one
// endpoint: the failures in a row that outlier detection counts. Each
// sits on its own cache line; a success writes only when a failure came
// before it, so the steady state only reads.
type sharedHost struct {
	consecutive5xx         atomic.Int32
	consecutiveConnectFail atomic.Int32
	_                      [cacheLine - 8]byte
}

// clusterState is the part of a cluster that changes while it serves,
// shared by the Cluster (main side) and every worker's view: the host set
// the monitor publishes, the failure counts workers report, the circuit
// breakers' counts.
type clusterState struct {
	hosts  atomic.Pointer[HostSet]
	shared []sharedHost // by endpoint
	// wake pokes the monitor when a worker's report crossed an outlier
	// threshold; a send that finds it full is dropped (a poke is pending).
	wake chan struct{}
	// Thresholds from outlier_detection; 0 disables a trigger.
	consecutive5xx         int32
	consecutiveConnectFail int32
	breakers               *breakers // nil: no circuit breakers
	// monitor is the cluster's Monitor, if it has one (admin API).
	monitor atomic.Pointer[Monitor]

	// viewsMu guards views: every worker view made of the cluster, so
	// that the admin API can sum their per-endpoint counters.
	viewsMu sync.Mutex
	views   []*WorkerCluster
}

func newClusterState(addrs []string, spec config.Cluster) *clusterState {
	n := len(addrs)
	st := &clusterState{shared: make([]sharedHost, n), wake: make(chan struct{}, 1)}
	healthy, ejected := make([]bool, n), make([]bool, n)
	for i := range healthy {
		// With health checks, an endpoint is healthy only once it
		// passed one: the monitor's first round decides before the
		// generation serves.
		healthy[i] = spec.HealthCheck == nil
	}
	st.hosts.Store(newHostSet(addrs, healthy, ejected))
	if od := spec.OutlierDetection; od != nil {
		st.consecutive5xx = int32(orZero(od.Consecutive5xx))
		st.consecutiveConnectFail = int32(orZero(od.ConsecutiveConnectFailure))
	}
	if cb := spec.CircuitBreakers; cb != nil {
		st.breakers = newBreakers(spec.Name, cb)
	}
	return st
}

// poke wakes the monitor without ever blocking the worker.
func (st *clusterState) poke() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// hostCounters are one worker's counts for one endpoint, for the admin
// API; padded so that neighbouring endpoints' counts of busy workers do
// not share a cache line.
type hostCounters struct {
	rq          atomic.Uint64 // responses whose head arrived
	rq5xx       atomic.Uint64 // of which 5xx, plus failures after connect
	connectFail atomic.Uint64
	_           [cacheLine - 24]byte
}

// ReportStatus tells the cluster how a request sent to endpoint ended: the
// status of the response head, or 0 when the upstream failed after the
// connect (reset, timeout, malformed response), which outlier detection
// counts as a 5xx. It is called on the request path: atomics only.
func (wc *WorkerCluster) ReportStatus(endpoint, status int) {
	if endpoint < 0 || endpoint >= len(wc.hostStats) {
		return
	}
	hc := &wc.hostStats[endpoint]
	st := wc.state
	if status > 0 && status < 500 { // a 101 too: the upgrade worked
		hc.rq.Add(1)
		if st.consecutive5xx > 0 {
			if h := &st.shared[endpoint]; h.consecutive5xx.Load() != 0 {
				h.consecutive5xx.Store(0)
			}
		}
		return
	}
	if status != 0 {
		hc.rq.Add(1)
	}
	hc.rq5xx.Add(1)
	if st.consecutive5xx > 0 && st.shared[endpoint].consecutive5xx.Add(1) == st.consecutive5xx {
		st.poke()
	}
}

// reportConnect counts the outcome of a connect to endpoint i.
func (wc *WorkerCluster) reportConnect(i int, ok bool) {
	st := wc.state
	if ok {
		if st.consecutiveConnectFail > 0 {
			if h := &st.shared[i]; h.consecutiveConnectFail.Load() != 0 {
				h.consecutiveConnectFail.Store(0)
			}
		}
		return
	}
	wc.hostStats[i].connectFail.Add(1)
	if st.consecutiveConnectFail > 0 && st.shared[i].consecutiveConnectFail.Add(1) == st.consecutiveConnectFail {
		st.poke()
	}
}

// ErrOverflow: a circuit breaker of the cluster is open, and the request
// was refused at once rather than queued. The HTTP data path answers 503.
var ErrOverflow = errors.New("upstream overflow")

// OverflowError names the breaker that refused a request.
type OverflowError struct {
	Cluster string
	Limit   string // the config key: "max_requests", ...
	Max     int64
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("cluster %q: circuit breaker %s (%d) reached: request refused", e.Cluster, e.Limit, e.Max)
}

// Is makes errors.Is(err, ErrOverflow) true.
func (e *OverflowError) Is(target error) bool { return target == ErrOverflow }

// breakers are a cluster's circuit breakers: counts summed over every
// worker (as Envoy's are), each on its own cache line. The errors are
// built once, so a refusal allocates nothing.
type breakers struct {
	maxConnections, maxPending, maxRequests, maxRetries int64

	connections, pending, requests, retries paddedCount

	errConnections, errPending, errRequests, errRetries *OverflowError
}

func newBreakers(cluster string, cb *config.CircuitBreakers) *breakers {
	b := &breakers{
		maxConnections: int64(cb.MaxConnections),
		maxPending:     int64(cb.MaxPendingRequests),
		maxRequests:    int64(cb.MaxRequests),
		maxRetries:     int64(orZero(cb.MaxRetries)),
	}
	b.errConnections = &OverflowError{cluster, "max_connections", b.maxConnections}
	b.errPending = &OverflowError{cluster, "max_pending_requests", b.maxPending}
	b.errRequests = &OverflowError{cluster, "max_requests", b.maxRequests}
	b.errRetries = &OverflowError{cluster, "max_retries", b.maxRetries}
	return b
}

// take adds one to c unless that would pass max; it reports whether it
// did.
func take(c *paddedCount, max int64) bool {
	if c.n.Add(1) > max {
		c.n.Add(-1)
		return false
	}
	return true
}

// register records a worker view so the admin API can sum its counters.
func (st *clusterState) register(wc *WorkerCluster) {
	st.viewsMu.Lock()
	st.views = append(st.views, wc)
	st.viewsMu.Unlock()
}
