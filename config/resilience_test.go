package config

import (
	"strings"
	"testing"
	"time"
)

// TestResilienceDefaults: a table written empty gets every default; a
// cluster without the tables has none of them (no checks, no ejection,
// no breakers).
func TestResilienceDefaults(t *testing.T) {
	c := mustParse(t, `
[[clusters]]
name = "a"
endpoints = ["127.0.0.1:9000"]
  [clusters.health_check]
  [clusters.outlier_detection]
  [clusters.circuit_breakers]
[[clusters]]
name = "b"
endpoints = ["127.0.0.1:9000"]
`, "r.toml")
	a, b := c.Clusters[0], c.Clusters[1]
	if b.HealthCheck != nil || b.OutlierDetection != nil || b.CircuitBreakers != nil {
		t.Errorf("cluster without the tables got %+v %+v %+v", b.HealthCheck, b.OutlierDetection, b.CircuitBreakers)
	}
	hc := a.HealthCheck
	if hc == nil || hc.Path != "" || len(hc.ExpectedStatuses) != 1 || hc.ExpectedStatuses[0] != 200 ||
		hc.Interval.D() != time.Second || hc.Timeout.D() != 500*time.Millisecond ||
		hc.UnhealthyThreshold != 2 || hc.HealthyThreshold != 1 {
		t.Errorf("health_check defaults: %+v", hc)
	}
	od := a.OutlierDetection
	if od == nil || *od.Consecutive5xx != 5 || *od.ConsecutiveConnectFailure != 3 || od.BaseEjectionTime.D() != 30*time.Second || *od.MaxEjectionPercent != 50 {
		t.Errorf("outlier_detection defaults: %+v", od)
	}
	cb := a.CircuitBreakers
	if cb == nil || cb.MaxConnections != 1024 || cb.MaxPendingRequests != 1024 || cb.MaxRequests != 1024 || *cb.MaxRetries != 3 {
		t.Errorf("circuit_breakers defaults: %+v", cb)
	}
}

func TestResilienceInvalid(t *testing.T) {
	for i, tc := range []struct{ body, want string }{
		{`[clusters.health_check]
path = "healthz"`, `health_check.path: "healthz": must start with "/"`},
		{`[clusters.health_check]
expected_statuses = []`, `expected_statuses: empty`},
		{`[clusters.health_check]
expected_statuses = [200, 99]`, `expected_statuses[1]: 99: not a final HTTP status`},
		{`[clusters.health_check]
expected_statuses = 200`, `expected an array of integers, got integer 200 (write expected_statuses = [200])`},
		{`[clusters.health_check]
interval = "1ns"`, `health_check.interval: "1ns": must be between 10ms and 1h`},
		{`[clusters.health_check]
unhealthy_threshold = 0`, `unhealthy_threshold: 0: must be between 1 and 1000`},
		{`[clusters.outlier_detection]
max_ejection_percent = 101`, `max_ejection_percent: 101: must be between 0 and 100`},
		{`[clusters.circuit_breakers]
max_requests = 0`, `circuit_breakers.max_requests: 0: must be between 1 and`},
		{`[clusters.circuit_breakers]
max_request = 5`, `unknown key (did you mean max_requests?)`},
		{`[clusters.health_check]
timeout = "20s"`, `health_check.timeout: "20s": must be shorter than [hot_restart] handoff_timeout ("10s")`},
	} {
		data := "[[clusters]]\nname = \"a\"\nendpoints = [\"127.0.0.1:9000\"]\n" + tc.body + "\n"
		dumpBadConfig(t, "resilience", i, data)
		_, err := Parse([]byte(data), "r.toml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse:\n%s\ngot %v\nwant an error containing %q", data, err, tc.want)
		}
	}
}
