package config

// HealthCheck is a cluster's active health check, run by the main side
// against every endpoint, every Interval (plus a random jitter of up to
// HealthCheckJitterPercent of it).
type HealthCheck struct {
	// Path, when set, makes the check an HTTP GET of this path whose
	// status must be one of ExpectedStatuses; empty: a TCP connect.
	Path string `toml:"path,omitempty" json:"path,omitempty"`
	// ExpectedStatuses are the statuses that pass an HTTP check.
	ExpectedStatuses []int    `toml:"expected_statuses" json:"expected_statuses" default:"200"`
	Interval         Duration `toml:"interval" json:"interval" default:"1s" bound:"10ms..1h"`
	// Timeout bounds one check, connect and response together.
	Timeout Duration `toml:"timeout" json:"timeout" default:"500ms" bound:"1ms..5m"`
	// UnhealthyThreshold: consecutive failed checks that make a healthy
	// endpoint unhealthy.
	UnhealthyThreshold int `toml:"unhealthy_threshold" json:"unhealthy_threshold" default:"2" bound:"1..1000" note:"failed checks in a row; default %v"`
	// HealthyThreshold: consecutive passed checks that make an unhealthy
	// endpoint healthy again (one is enough for an endpoint not yet
	// checked, when a generation starts).
	HealthyThreshold int `toml:"healthy_threshold" json:"healthy_threshold" default:"1" bound:"1..1000" note:"passed checks in a row; default %v"`
}

// OutlierDetection ejects an endpoint that fails requests in a row, for
// BaseEjectionTime times the number of times it has been ejected.
type OutlierDetection struct {
	// Consecutive5xx: 5xx responses (or upstream failures after
	// connect) in a row that eject an endpoint; 0 disables.
	Consecutive5xx *int `toml:"consecutive_5xx" json:"consecutive_5xx" default:"5" bound:"0..1000" note:"0 disables; default %v"`
	// ConsecutiveConnectFailure: failed connects in a row that eject an
	// endpoint; 0 disables.
	ConsecutiveConnectFailure *int     `toml:"consecutive_connect_failure" json:"consecutive_connect_failure" default:"3" bound:"0..1000" note:"0 disables; default %v"`
	BaseEjectionTime          Duration `toml:"base_ejection_time" json:"base_ejection_time" default:"30s" bound:"10ms..24h"`
	// MaxEjectionPercent: no endpoint is ejected while this share of
	// the cluster's endpoints is ejected already.
	MaxEjectionPercent *int `toml:"max_ejection_percent" json:"max_ejection_percent" default:"50" bound:"0..100" note:"a percentage; default %v"`
}

// CircuitBreakers bound a cluster's load, summed over all workers.
type CircuitBreakers struct {
	// MaxConnections bounds the open upstream connections.
	MaxConnections int `toml:"max_connections" json:"max_connections" default:"1024" bound:"1..MaxConnectionsLimit" note:"default %v"`
	// MaxPendingRequests bounds the requests waiting for a new
	// connection to be established.
	MaxPendingRequests int `toml:"max_pending_requests" json:"max_pending_requests" default:"1024" bound:"1..MaxConnectionsLimit" note:"default %v"`
	// MaxRequests bounds the requests in flight.
	MaxRequests int `toml:"max_requests" json:"max_requests" default:"1024" bound:"1..MaxConnectionsLimit" note:"default %v"`
	// MaxRetries bounds the retries in flight.
	MaxRetries *int `toml:"max_retries" json:"max_retries" default:"3" bound:"0..MaxConnectionsLimit" note:"default %v"`
}
