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
		if v.inBounds(k+".timeout") && hc.Timeout >= v.c.HotRestart.HandoffTimeout {
			// A generation checks every endpoint once before it is
			// ready, which must fit in the wait for its readiness.
			v.ps.add(k+".timeout", "%q: must be shorter than [hot_restart] handoff_timeout (%q): a new generation checks every endpoint once before it is ready; lower timeout or raise handoff_timeout",
				durationString(hc.Timeout), durationString(v.c.HotRestart.HandoffTimeout))
		}
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
