package upstream

// ClusterStatus is what the admin API shows of a cluster: every endpoint's
// health and its counters summed over the workers.
type ClusterStatus struct {
	Name string `json:"name"`
	// Panic: no endpoint is healthy and not ejected, so all are used.
	Panic     bool             `json:"panic"`
	Endpoints []EndpointStatus `json:"endpoints"`
	// Circuit breakers' current counts, when configured.
	Breakers *BreakerStatus `json:"circuit_breakers,omitempty"`
}

// EndpointStatus is one endpoint of a ClusterStatus.
type EndpointStatus struct {
	Address string `json:"address"`
	// HealthCheck: CheckNone, CheckUnknown, CheckHealthy or
	// CheckUnhealthy.
	HealthCheck  string `json:"health_check"`
	Ejected      bool   `json:"ejected"`
	EjectedUntil string `json:"ejected_until,omitempty"` // RFC 3339
	Ejections    int    `json:"ejections"`
	// Counters of this generation, summed over its workers.
	RqTotal           uint64 `json:"rq_total"`
	Rq5xx             uint64 `json:"rq_5xx"`
	CxConnectFail     uint64 `json:"cx_connect_fail"`
	Consecutive5xx    int32  `json:"consecutive_5xx"`
	ConsecutiveCxFail int32  `json:"consecutive_connect_failure"`
}

// BreakerStatus is a cluster's circuit breakers: in use and limit.
type BreakerStatus struct {
	Connections        int64 `json:"connections"`
	MaxConnections     int64 `json:"max_connections"`
	PendingRequests    int64 `json:"pending_requests"`
	MaxPendingRequests int64 `json:"max_pending_requests"`
	Requests           int64 `json:"requests"`
	MaxRequests        int64 `json:"max_requests"`
	Retries            int64 `json:"retries"`
	MaxRetries         int64 `json:"max_retries"`
}

// Status returns the cluster's status now. It takes a lock that the
// request path never takes (the list of worker views).
func (c *Cluster) Status() ClusterStatus {
	cs := ClusterStatus{Name: c.Name, Endpoints: make([]EndpointStatus, len(c.Endpoints))}
	for i, ep := range c.Endpoints {
		cs.Endpoints[i] = EndpointStatus{Address: ep.Address, HealthCheck: CheckNone}
	}
	st := c.state
	if st == nil {
		return cs
	}
	hs := st.hosts.Load()
	cs.Panic = hs.Panic()
	for i := range cs.Endpoints {
		cs.Endpoints[i].Address = hs.addrs[i]
	}
	if m := st.monitor.Load(); m != nil {
		for i, eh := range m.Endpoints() {
			e := &cs.Endpoints[i]
			e.HealthCheck, e.Ejected, e.Ejections = eh.Check, eh.Ejected, eh.Ejections
			if eh.Ejected {
				e.EjectedUntil = eh.EjectedUntil.UTC().Format("2006-01-02T15:04:05.000Z07:00")
			}
		}
	}
	for i := range cs.Endpoints {
		cs.Endpoints[i].Consecutive5xx = st.shared[i].consecutive5xx.Load()
		cs.Endpoints[i].ConsecutiveCxFail = st.shared[i].consecutiveConnectFail.Load()
	}
	st.viewsMu.Lock()
	for _, wc := range st.views {
		for i := range wc.hostStats {
			h := &wc.hostStats[i]
			e := &cs.Endpoints[i]
			e.RqTotal += h.rq.Load()
			e.Rq5xx += h.rq5xx.Load()
			e.CxConnectFail += h.connectFail.Load()
		}
	}
	st.viewsMu.Unlock()
	if b := st.breakers; b != nil {
		cs.Breakers = &BreakerStatus{
			Connections: b.connections.n.Load(), MaxConnections: b.maxConnections,
			PendingRequests: b.pending.n.Load(), MaxPendingRequests: b.maxPending,
			Requests: b.requests.n.Load(), MaxRequests: b.maxRequests,
			Retries: b.retries.n.Load(), MaxRetries: b.maxRetries,
		}
	}
	return cs
}
