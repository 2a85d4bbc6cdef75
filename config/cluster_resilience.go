package config

// HealthCheck is a cluster's active health check, run by the main side
// against every endpoint, every Interval (plus a random jitter of up to
// HealthCheckJitterPercent of it).
type HealthCheck struct {
	// Path, when set, makes the check an HTTP GET of this path whose
	// status must be one of ExpectedStatuses; empty: a TCP connect.
	Path string `toml:"path,omitempty" json:"path,omitempty"`
	// ExpectedStatuses are the statuses that pass an HTTP check.
	ExpectedStatuses []int    `toml:"expected_statuses" json:"expected_statuses"`
	Interval         Duration `toml:"interval" json:"interval"`
	// Timeout bounds one check, connect and response together.
	Timeout Duration `toml:"timeout" json:"timeout"`
	// UnhealthyThreshold: consecutive failed checks that make a healthy
	// endpoint unhealthy.
	UnhealthyThreshold int `toml:"unhealthy_threshold" json:"unhealthy_threshold"`
	// HealthyThreshold: consecutive passed checks that make an unhealthy
	// endpoint healthy again (one is enough for an endpoint not yet
	// checked, when a generation starts).
	HealthyThreshold int `toml:"healthy_threshold" json:"healthy_threshold"`
}

// OutlierDetection ejects an endpoint that fails requests in a row, for
// BaseEjectionTime times the number of times it has been ejected.
type OutlierDetection struct {
	// Consecutive5xx: 5xx responses (or upstream failures after
	// connect) in a row that eject an endpoint; 0 disables.
	Consecutive5xx int `toml:"consecutive_5xx" json:"consecutive_5xx"`
	// ConsecutiveConnectFailure: failed connects in a row that eject an
	// endpoint; 0 disables.
	ConsecutiveConnectFailure int      `toml:"consecutive_connect_failure" json:"consecutive_connect_failure"`
	BaseEjectionTime          Duration `toml:"base_ejection_time" json:"base_ejection_time"`
	// MaxEjectionPercent: no endpoint is ejected while this share of
	// the cluster's endpoints is ejected already.
	MaxEjectionPercent int `toml:"max_ejection_percent" json:"max_ejection_percent"`
}

// CircuitBreakers bound a cluster's load, summed over all workers.
type CircuitBreakers struct {
	// MaxConnections bounds the open upstream connections.
	MaxConnections int `toml:"max_connections" json:"max_connections"`
	// MaxPendingRequests bounds the requests waiting for a new
	// connection to be established.
	MaxPendingRequests int `toml:"max_pending_requests" json:"max_pending_requests"`
	// MaxRequests bounds the requests in flight.
	MaxRequests int `toml:"max_requests" json:"max_requests"`
	// MaxRetries bounds the retries in flight.
	MaxRetries int `toml:"max_retries" json:"max_retries"`
}
