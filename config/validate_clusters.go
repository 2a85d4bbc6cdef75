package config

import (
	"fmt"
	"slices"
	"strings"
)

func (v *validator) clusters() {
	names := map[string]string{}
	for i := range v.c.Clusters {
		c := &v.c.Clusters[i]
		key := itemKey("clusters", i, c.Name)
		v.name(key, "cluster", c.Name, names)
		if !slices.Contains(lbPolicies, c.LBPolicy) {
			v.ps.add(key+".lb_policy", "%s: unknown policy (use %s)", quote(c.LBPolicy), orList(lbPolicies))
		}
		v.hashOn(key, c)
		if len(c.Endpoints) == 0 {
			v.ps.add(key+".endpoints", "a cluster needs at least one endpoint, like endpoints = [\"127.0.0.1:9000\"]")
		}
		for j, e := range c.Endpoints {
			if msg := checkAddress(e, false, 1); msg != "" {
				v.ps.add(fmt.Sprintf("%s.endpoints[%d]", key, j), "%s", msg)
			}
		}
		v.duration(key+".connect_timeout", "clusters.connect_timeout", c.ConnectTimeout, DefaultConnectTimeout)
		v.duration(key+".idle_timeout", "clusters.idle_timeout", c.IdleTimeout, DefaultUpstreamIdle)
		v.number(key+".max_idle_per_endpoint", "clusters.max_idle_per_endpoint", c.MaxIdlePerEndpoint,
			fmt.Sprintf("0 keeps no idle connections; leave it out for the default, %d", DefaultMaxIdlePerEndpoint))
		v.duration(key+".dns_refresh", "clusters.dns_refresh", c.DNSRefresh, DefaultDNSRefresh)
		v.resilience(key, c)
		v.clusterTLS(key, c)
	}
}

// resilience checks a cluster's health_check, outlier_detection and
// circuit_breakers tables.
func (v *validator) resilience(key string, c *Cluster) {
	if hc := c.HealthCheck; hc != nil {
		k := key + ".health_check"
		if hc.Path != "" && (!strings.HasPrefix(hc.Path, "/") || strings.ContainsAny(hc.Path, " \t\r\n")) {
			v.ps.add(k+".path", "%s: must start with \"/\" and contain no spaces or control characters (leave path out for a TCP connect check)", quote(hc.Path))
		}
		if len(hc.ExpectedStatuses) == 0 {
			v.ps.add(k+".expected_statuses", "empty: list the statuses that pass, like expected_statuses = [200] (the default)")
		}
		for i, st := range hc.ExpectedStatuses {
			if st < 200 || st > 599 {
				v.ps.add(fmt.Sprintf("%s.expected_statuses[%d]", k, i), "%d: not a final HTTP status (200 to 599)", st)
			}
		}
		v.duration(k+".interval", "clusters.health_check.interval", hc.Interval, DefaultHealthCheckInterval)
		if v.duration(k+".timeout", "clusters.health_check.timeout", hc.Timeout, DefaultHealthCheckTimeout) &&
			hc.Timeout >= v.c.HotRestart.HandoffTimeout {
			// A generation checks every endpoint once before it is
			// ready, which must fit in the wait for its readiness.
			v.ps.add(k+".timeout", "%q: must be shorter than [hot_restart] handoff_timeout (%q): a new generation checks every endpoint once before it is ready; lower timeout or raise handoff_timeout",
				durationString(hc.Timeout), durationString(v.c.HotRestart.HandoffTimeout))
		}
		v.number(k+".unhealthy_threshold", "clusters.health_check.unhealthy_threshold", hc.UnhealthyThreshold,
			fmt.Sprintf("failed checks in a row; default %d", DefaultUnhealthyThreshold))
		v.number(k+".healthy_threshold", "clusters.health_check.healthy_threshold", hc.HealthyThreshold,
			fmt.Sprintf("passed checks in a row; default %d", DefaultHealthyThreshold))
	}
	if od := c.OutlierDetection; od != nil {
		k := key + ".outlier_detection"
		v.number(k+".consecutive_5xx", "clusters.outlier_detection.consecutive_5xx", od.Consecutive5xx,
			fmt.Sprintf("0 disables; default %d", DefaultConsecutive5xx))
		v.number(k+".consecutive_connect_failure", "clusters.outlier_detection.consecutive_connect_failure", od.ConsecutiveConnectFailure,
			fmt.Sprintf("0 disables; default %d", DefaultConsecutiveConnectFailure))
		v.duration(k+".base_ejection_time", "clusters.outlier_detection.base_ejection_time", od.BaseEjectionTime, DefaultBaseEjectionTime)
		v.number(k+".max_ejection_percent", "clusters.outlier_detection.max_ejection_percent", od.MaxEjectionPercent,
			fmt.Sprintf("a percentage; default %d", DefaultMaxEjectionPercent))
	}
	if cb := c.CircuitBreakers; cb != nil {
		k := key + ".circuit_breakers"
		v.number(k+".max_connections", "clusters.circuit_breakers.max_connections", cb.MaxConnections,
			fmt.Sprintf("default %d", DefaultCircuitBreakerMaxConnection))
		v.number(k+".max_pending_requests", "clusters.circuit_breakers.max_pending_requests", cb.MaxPendingRequests,
			fmt.Sprintf("default %d", DefaultCircuitBreakerMaxPending))
		v.number(k+".max_requests", "clusters.circuit_breakers.max_requests", cb.MaxRequests,
			fmt.Sprintf("default %d", DefaultCircuitBreakerMaxRequests))
		v.number(k+".max_retries", "clusters.circuit_breakers.max_retries", cb.MaxRetries,
			fmt.Sprintf("default %d", DefaultCircuitBreakerMaxRetries))
	}
}

// clusterRef checks that a cluster named by key exists.
func (v *validator) clusterRef(key, name string) {
	if v.c.Cluster(name) != nil {
		return
	}
	var names []string
	for _, c := range v.c.Clusters {
		if c.Name != "" {
			names = append(names, c.Name)
		}
	}
	switch {
	case len(names) == 0:
		v.ps.add(key, "%s: no such cluster (there are none; add a [[clusters]] named %s)", quote(name), quote(name))
	case closest(name, names) != "":
		v.ps.add(key, "%s: no such cluster (did you mean %s?)", quote(name), quote(closest(name, names)))
	default:
		v.ps.add(key, "%s: no such cluster (clusters: %s)", quote(name), strings.Join(names, ", "))
	}
}
