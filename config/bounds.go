package config

import (
	"strings"
	"time"
)

// MaxConcurrency bounds server.concurrency.
const MaxConcurrency = 1024

// MaxConnectionsLimit bounds server.max_connections and a listener's
// max_connections: 16 Mi connections, past what a process can hold (each
// is a descriptor and kernel buffers; fs.nr_open is 1 Mi by default).
const MaxConnectionsLimit = 1 << 24

// A durationBound is the range a duration key accepts: what the code that
// consumes it can honour. Minimums keep a timer from firing so often that
// it burns a core (a ticker at "1ns") or from cutting every connection
// before it can do anything; maximums keep values where sums of them (the
// supervisor adds commit_window, parent_shutdown_time and a margin) cannot
// overflow, and catch a unit typed wrong ("30000h").
type durationBound struct{ min, max time.Duration }

// durationBounds maps every duration key, by its path in the schema
// (indices left out), to its range. A test checks that every duration of
// the schema has one.
var durationBounds = map[string]durationBound{
	// One timer per drain; the default parent_shutdown_time is 1.5 x
	// drain_time, which stays within its own maximum.
	"server.drain_time": {100 * time.Millisecond, 24 * time.Hour},
	// Long-lived TCP-proxy connections may be given days, not more: every
	// reload in that time leaves a draining process behind.
	"server.parent_shutdown_time": {100 * time.Millisecond, 7 * 24 * time.Hour},
	// One timer per hand-over; the parent keeps its sockets that long.
	"hot_restart.commit_window": {10 * time.Millisecond, time.Hour},
	// Each step of a hand-over, and the child's start-up, must fit in it.
	"hot_restart.handoff_timeout": {100 * time.Millisecond, time.Hour},
	// A ticker on the main goroutine: each tick merges every histogram.
	"stats.flush_interval": {10 * time.Millisecond, 5 * time.Minute},
	// A TCP session's idle timer re-arms itself while bytes flow: at
	// 100ms that is at most ten wake-ups a second per connection.
	"listeners.idle_timeout":    {100 * time.Millisecond, 7 * 24 * time.Hour},
	"listeners.request_timeout": {10 * time.Millisecond, 24 * time.Hour},
	"listeners.header_timeout":  {10 * time.Millisecond, time.Hour},
	"listeners.write_timeout":   {10 * time.Millisecond, 24 * time.Hour},
	// 0 (left out) means the listener's request_timeout.
	"listeners.routes.timeout":         {10 * time.Millisecond, 24 * time.Hour},
	"listeners.routes.per_try_timeout": {10 * time.Millisecond, 24 * time.Hour},
	// The kernel gives up on a connect after its SYN retries (about two
	// minutes with the default net.ipv4.tcp_syn_retries = 6) anyway.
	"clusters.connect_timeout": {10 * time.Millisecond, 5 * time.Minute},
	"clusters.idle_timeout":    {100 * time.Millisecond, 24 * time.Hour},
	// One lookup per interval and host name, on the main side.
	"clusters.dns_refresh": {100 * time.Millisecond, 24 * time.Hour},
	// One round of checks per interval and cluster, on the main side.
	"clusters.health_check.interval": {10 * time.Millisecond, time.Hour},
	"clusters.health_check.timeout":  {time.Millisecond, 5 * time.Minute},
	// Multiplied by the number of ejections; a day keeps the product
	// far from overflowing.
	"clusters.outlier_detection.base_ejection_time": {10 * time.Millisecond, 24 * time.Hour},
	// A new key per rotation; a week keeps a stolen key's reach short.
	"listeners.tls.session_ticket_rotation": {time.Minute, 7 * 24 * time.Hour},
	"listeners.tls.handshake_timeout":       {10 * time.Millisecond, 5 * time.Minute},
}

// An intBound is the range an integer key accepts.
type intBound struct{ min, max int }

// intBounds maps every integer key, by its path in the schema, to its
// range. A test checks that every integer of the schema has one.
var intBounds = map[string]intBound{
	"server.concurrency":        {0, MaxConcurrency},
	"server.max_connections":    {0, MaxConnectionsLimit},
	"listeners.max_connections": {0, MaxConnectionsLimit},
	// At least one: the generation a rollback returns to drains too. At
	// most 62: with the serving and the starting one, the 64 owner slots
	// a stats region can have.
	"hot_restart.max_draining_generations": {1, 62},
	// The request head is read into memory whole: up to 1 MiB (Envoy's
	// hard limit is 8 MiB, nginx and HAProxy default to 8-16 KiB); at
	// least a request line with a short URL and a Host. Near 2^63 the
	// HTTP server's read limit (this plus 4096) overflowed and every
	// request got a 431.
	"listeners.max_header_bytes": {1024, 1 << 20},
	// A direct response is a final response: 1xx are not.
	"listeners.routes.direct_response.status": {200, 599},
	// Each retry holds one of the cluster's max_retries while it runs.
	"listeners.routes.num_retries": {0, 10},
	// A record is about 700 bytes: the largest queue holds 700 MiB.
	"listeners.access_log.queue_size": {16, 1 << 20},
	// Connections from one address to one endpoint are bounded by the
	// ephemeral port range.
	"clusters.max_idle_per_endpoint":                         {0, 65535},
	"clusters.health_check.unhealthy_threshold":              {1, 1000},
	"clusters.health_check.healthy_threshold":                {1, 1000},
	"clusters.outlier_detection.consecutive_5xx":             {0, 1000},
	"clusters.outlier_detection.consecutive_connect_failure": {0, 1000},
	"clusters.outlier_detection.max_ejection_percent":        {0, 100},
	"clusters.circuit_breakers.max_connections":              {1, MaxConnectionsLimit},
	"clusters.circuit_breakers.max_pending_requests":         {1, MaxConnectionsLimit},
	"clusters.circuit_breakers.max_requests":                 {1, MaxConnectionsLimit},
	"clusters.circuit_breakers.max_retries":                  {0, MaxConnectionsLimit},
}

// duration checks d, the value of key, against the bound of path, its key
// in the schema, and reports whether it is within.
func (v *validator) duration(key, path string, d Duration, def time.Duration) bool {
	b, ok := durationBounds[path]
	if !ok {
		panic("config: no bound for duration " + path)
	}
	if d.D() < b.min || d.D() > b.max {
		v.ps.add(key, "%q: must be between %s and %s (leave it out for the default, %s)",
			durationString(d), shortDuration(b.min), shortDuration(b.max), shortDuration(def))
		return false
	}
	return true
}

// number checks n, the value of key, against the bound of path, its key
// in the schema, and reports whether it is within; note says what 0 or
// the default is.
func (v *validator) number(key, path string, n int, note string) bool {
	b, ok := intBounds[path]
	if !ok {
		panic("config: no bound for integer " + path)
	}
	if n < b.min || n > b.max {
		v.ps.add(key, "%d: must be between %d and %d (%s)", n, b.min, b.max, note)
		return false
	}
	return true
}

// shortDuration writes d without zero units: "5m", "168h", "1m30s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
