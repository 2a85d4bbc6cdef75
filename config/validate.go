package config

import (
	"fmt"
	"mime"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
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

var (
	lbPolicies = []string{LBRoundRobin, LBLeastRequest, LBRandom, LBRingHash, LBMaglev}
	balances   = []string{BalanceLeastConn, BalanceHash, BalanceKernel}
	logLevels  = []string{"trace", "debug", "info", "warn", "error"}
	logFormats = []string{"text", "json"}
	protocols  = []string{ProtocolHTTP, ProtocolTCP}
)

// Validate checks c as a whole, defaults already filled in (Parse does
// both), and returns an *Error listing every problem, or nil.
func (c *Config) Validate() error {
	v := validator{c: c}
	v.server()
	v.admin()
	v.log()
	v.hotRestart()
	v.stats()
	v.listeners()
	v.clusters()
	return v.ps.err(c.Source)
}

type validator struct {
	c  *Config
	ps problems
	// addrs maps each listener's normalized address to its key.
	addrs map[string]string
}

func (v *validator) server() {
	s := v.c.Server
	v.number("server.concurrency", "server.concurrency", s.Concurrency, "0, the default, means one worker per CPU this process may run on")
	drainOK := v.duration("server.drain_time", "server.drain_time", s.DrainTime, DefaultDrainTime)
	if v.duration("server.parent_shutdown_time", "server.parent_shutdown_time", s.ParentShutdownTime, DefaultParentShutdownTime) &&
		drainOK && s.ParentShutdownTime < s.DrainTime {
		v.ps.add("server.parent_shutdown_time", "%q: must be at least drain_time (%q): a draining generation exits at parent_shutdown_time, which would cut off requests that drain_time still gives time to finish; raise parent_shutdown_time or lower drain_time",
			durationString(s.ParentShutdownTime), durationString(s.DrainTime))
	}
	v.number("server.max_connections", "server.max_connections", s.MaxConnections,
		"0, the default, derives the bound from the open-file limit")
}

func (v *validator) admin() {
	a := v.c.Admin.Address
	if msg := checkAddress(a, true, 0); msg != "" {
		v.ps.add("admin.address", "%s", msg)
		return
	}
	if !v.c.Admin.AllowRemote && !v.c.Admin.Loopback() {
		v.ps.add("admin.address", "%s: not a loopback address, and the admin API has no authentication and can drain and stop the proxy; bind it to 127.0.0.1 or [::1] (default %q), or set [admin] allow_remote = true to expose it on purpose (and firewall it)", quote(a), DefaultAdminAddress)
		return
	}
	// The admin listener must not collide with a proxy listener.
	n := normAddress(a)
	for i, l := range v.c.Listeners {
		if n != "" && checkAddress(l.Address, true, 0) == "" && normAddress(l.Address) == n {
			v.ps.add("admin.address", "%s: %s listens there already; give the admin API an address of its own", quote(a), itemKey("listeners", i, l.Name))
			return
		}
	}
}

func (v *validator) hotRestart() {
	h := v.c.HotRestart
	if h.SocketDir != "" && !filepath.IsAbs(h.SocketDir) {
		v.ps.add("hot_restart.socket_dir", "%s: must be an absolute path (a relative one would depend on the directory each generation starts in)", quote(h.SocketDir))
	}
	v.duration("hot_restart.commit_window", "hot_restart.commit_window", h.CommitWindow, DefaultCommitWindow)
	v.duration("hot_restart.handoff_timeout", "hot_restart.handoff_timeout", h.HandoffTimeout, DefaultHandoffTimeout)
	v.number("hot_restart.max_draining_generations", "hot_restart.max_draining_generations", h.MaxDrainingGenerations,
		"past it the oldest draining generation is hurried")
}

func (v *validator) stats() {
	st := v.c.Stats
	if st.Path != "" && !filepath.IsAbs(st.Path) {
		v.ps.add("stats.path", "%s: must be an absolute path (every generation must find the same region, whatever directory it starts in)", quote(st.Path))
	}
	if m, err := parseFileMode(st.FileMode); err != nil {
		v.ps.add("stats.file_mode", "%s: %v", quote(st.FileMode), err)
	} else if m&0o022 != 0 {
		// Whoever can write the region can truncate it under every
		// generation or corrupt its stats; the region refuses such a file.
		v.ps.add("stats.file_mode", "%s: writable by group or others, who could truncate or corrupt the stats region (write it like \"0640\" so the group may read it, or \"0600\")", quote(st.FileMode))
	}
	v.duration("stats.flush_interval", "stats.flush_interval", st.FlushInterval, DefaultStatsFlushInterval)
}

func (v *validator) log() {
	l := v.c.Log
	if !slices.Contains(logLevels, l.Level) {
		v.ps.add("log.level", "%s: unknown level (use %s)", quote(l.Level), orList(logLevels))
	}
	if !slices.Contains(logFormats, l.Format) {
		v.ps.add("log.format", "%s: unknown format (use %s)", quote(l.Format), orList(logFormats))
	}
	if l.Path != "" && !filepath.IsAbs(l.Path) {
		v.ps.add("log.path", "%s: must be an absolute path (the supervisor and every generation must open the same file, whatever directory they start in)", quote(l.Path))
	}
}

func (v *validator) listeners() {
	v.addrs = map[string]string{}
	names := map[string]string{}
	for i := range v.c.Listeners {
		l := &v.c.Listeners[i]
		key := itemKey("listeners", i, l.Name)
		v.name(key, "listener", l.Name, names)

		if msg := checkAddress(l.Address, true, 0); msg != "" {
			v.ps.add(key+".address", "%s", msg)
		} else if n := normAddress(l.Address); n != "" {
			if other, ok := v.addrs[n]; ok {
				v.ps.add(key+".address", "%s: %s listens there already; give each listener its own address", quote(l.Address), other)
			} else {
				v.addrs[n] = key
			}
		}

		switch l.Protocol {
		case ProtocolTCP:
			v.tcpListener(key, l)
		case ProtocolHTTP:
			v.httpListener(key, l)
		case "":
			v.ps.add(key+".protocol", "missing (use %s)", orList(protocols))
		default:
			v.ps.add(key+".protocol", "%s: unknown protocol (use %s)", quote(l.Protocol), orList(protocols))
		}
		v.number(key+".max_connections", "listeners.max_connections", l.MaxConnections,
			"0, the default, leaves only [server] max_connections")
		if !slices.Contains(balances, l.Balance) {
			v.ps.add(key+".balance", "%s: unknown balance (use %s; default %s)", quote(l.Balance), orList(balances), quote(DefaultBalance))
		}
	}
}

func (v *validator) tcpListener(key string, l *Listener) {
	if l.Cluster == "" {
		v.ps.add(key+".cluster", "missing: a tcp listener needs the cluster its connections go to")
	} else {
		v.clusterRef(key+".cluster", l.Cluster)
	}
	if len(l.Routes) > 0 {
		v.ps.add(key+".routes", "a tcp listener has no routes (routes are for protocol = %q); remove them, or make it an http listener", ProtocolHTTP)
	}
	v.duration(key+".idle_timeout", "listeners.idle_timeout", l.IdleTimeout, DefaultTCPIdleTimeout)
	for _, d := range []struct {
		name string
		set  bool
		val  string
	}{
		{"request_timeout", l.RequestTimeout != 0, quote(durationString(l.RequestTimeout))},
		{"header_timeout", l.HeaderTimeout != 0, quote(durationString(l.HeaderTimeout))},
		{"max_header_bytes", l.MaxHeaderBytes != 0, strconv.Itoa(l.MaxHeaderBytes)},
		{"write_timeout", l.WriteTimeout != 0, quote(durationString(l.WriteTimeout))},
		{"trust_forwarded_for", l.TrustForwardedFor != nil, strconv.FormatBool(l.TrustsForwardedFor())},
		{"access_log", len(l.AccessLog) > 0, "[[listeners.access_log]]"},
	} {
		if d.set {
			v.ps.add(key+"."+d.name, "%s: applies only to http listeners; remove it", d.val)
		}
	}
}

func (v *validator) httpListener(key string, l *Listener) {
	if l.Cluster != "" {
		v.ps.add(key+".cluster", "%s: an http listener picks clusters in its routes; remove cluster here and add a route like { prefix = \"/\", cluster = %s }", quote(l.Cluster), quote(l.Cluster))
	}
	if len(l.Routes) == 0 {
		v.ps.add(key+".routes", "an http listener needs at least one route; add a [[listeners.routes]] with prefix = \"/\"")
	}
	v.duration(key+".idle_timeout", "listeners.idle_timeout", l.IdleTimeout, DefaultHTTPIdleTimeout)
	v.duration(key+".request_timeout", "listeners.request_timeout", l.RequestTimeout, DefaultRequestTimeout)
	v.duration(key+".header_timeout", "listeners.header_timeout", l.HeaderTimeout, DefaultHeaderTimeout)
	v.duration(key+".write_timeout", "listeners.write_timeout", l.WriteTimeout, DefaultWriteTimeout)
	v.number(key+".max_header_bytes", "listeners.max_header_bytes", l.MaxHeaderBytes,
		fmt.Sprintf("leave it out for the default, %d", DefaultMaxHeaderBytes))
	for j := range l.Routes {
		v.route(fmt.Sprintf("%s.routes[%d]", key, j), &l.Routes[j])
		v.retries(fmt.Sprintf("%s.routes[%d]", key, j), &l.Routes[j], l.RequestTimeout)
	}
	for j := range l.AccessLog {
		v.accessLog(fmt.Sprintf("%s.access_log[%d]", key, j), &l.AccessLog[j])
	}
}

func (v *validator) route(key string, r *Route) {
	switch {
	case r.Prefix == "" && r.Path == "":
		v.ps.add(key, "needs prefix (match a path prefix) or path (match a path exactly)")
	case r.Prefix != "" && r.Path != "":
		v.ps.add(key, "has both prefix (%s) and path (%s); keep one", quote(r.Prefix), quote(r.Path))
	case r.Prefix != "" && !strings.HasPrefix(r.Prefix, "/"):
		v.ps.add(key+".prefix", "%s: must start with \"/\"", quote(r.Prefix))
	case r.Path != "" && !strings.HasPrefix(r.Path, "/"):
		v.ps.add(key+".path", "%s: must start with \"/\"", quote(r.Path))
	}
	if r.Host != "" {
		if msg := checkRouteHost(r.Host); msg != "" {
			v.ps.add(key+".host", "%s: %s", quote(r.Host), msg)
		}
	}
	if r.Connect && r.Cluster == "" {
		v.ps.add(key+".connect", "true needs cluster = \"NAME\": a CONNECT tunnel goes to an endpoint of a cluster")
	}
	switch {
	case r.Cluster == "" && r.DirectResponse == nil:
		v.ps.add(key, "needs an action: cluster = \"NAME\" or direct_response = { status = 200, body = \"...\" }")
	case r.Cluster != "" && r.DirectResponse != nil:
		v.ps.add(key, "has both cluster (%s) and direct_response; keep one", quote(r.Cluster))
	case r.Cluster != "":
		v.clusterRef(key+".cluster", r.Cluster)
	default:
		dr := r.DirectResponse
		if v.number(key+".direct_response.status", "listeners.routes.direct_response.status", dr.Status,
			"a final HTTP status; there is no default") &&
			(dr.Status == 204 || dr.Status == 304) && dr.Body != "" {
			v.ps.add(key+".direct_response.body", "%s: a %d response has no body; remove body, or choose another status", quote(dr.Body), dr.Status)
		}
		if dr.ContentType != "" {
			if _, _, err := mime.ParseMediaType(dr.ContentType); err != nil {
				v.ps.add(key+".direct_response.content_type", "%s: not a media type (write it like \"text/plain; charset=utf-8\")", quote(dr.ContentType))
			}
		}
	}
}

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

// name checks a listener's or cluster's name, and that it is unique;
// seen maps the names so far to their keys.
func (v *validator) name(key, what, name string, seen map[string]string) {
	switch {
	case name == "":
		v.ps.add(key+".name", "missing: every %s needs a unique name", what)
		return
	case !validName(name):
		v.ps.add(key+".name", "%s: invalid name (use letters, digits, '_', '-' and '.': names appear in stats and logs)", quote(name))
	}
	if other, ok := seen[name]; ok {
		v.ps.add(key+".name", "%s: duplicate name (%s has it too); %s names must be unique", quote(name), other, what)
		return
	}
	seen[name] = key
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

// loopbackAddress reports whether a valid listen address binds loopback
// only: a loopback IP, or the name localhost. An empty host binds every
// address.
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback()
	}
	return strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

// itemKey names an element of an array of tables: `listeners[0] ("web")`.
func itemKey(array string, i int, name string) string {
	k := fmt.Sprintf("%s[%d]", array, i)
	if name != "" {
		k += " (" + quote(name) + ")"
	}
	return k
}

func validName(s string) bool {
	if len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// checkAddress checks a "host:port" address and returns what is wrong with
// it, value quoted first, or "". emptyHost allows ":8080" (all addresses);
// minPort is 0 where port 0 (any free port) is allowed, else 1.
func checkAddress(addr string, emptyHost bool, minPort int) string {
	example := "127.0.0.1:8080"
	if minPort > 0 {
		example = "127.0.0.1:9000"
	}
	if addr == "" {
		return fmt.Sprintf("missing (write host:port, like %q)", example)
	}
	q := quote(addr)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%s: not host:port (write it like %q, or %q for IPv6)", q, example, "[::1]:8080")
	}
	if port == "" || strings.TrimLeft(port, "0123456789") != "" {
		return fmt.Sprintf("%s: port %s is not a number", q, quote(port))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < minPort || n > 65535 {
		if minPort == 0 {
			return fmt.Sprintf("%s: port out of range 1-65535 (or 0 for any free port)", q)
		}
		return fmt.Sprintf("%s: port out of range 1-65535", q)
	}
	if host == "" {
		if emptyHost {
			return ""
		}
		return fmt.Sprintf("%s: missing host (write it like %q)", q, example)
	}
	if strings.Contains(host, ":") || strings.HasPrefix(addr, "[") {
		// An IPv6 literal (it came in brackets).
		if !strings.HasPrefix(addr, "[") {
			return fmt.Sprintf("%s: put an IPv6 address in brackets, like %q", q, "[::1]:8080")
		}
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return fmt.Sprintf("%s: %s is not an IPv6 address", q, quote(host))
		}
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if !validHostname(host) {
		return fmt.Sprintf("%s: %s is neither an IP address nor a valid hostname", q, quote(host))
	}
	return ""
}

// validHostname reports whether s is a DNS name: dot-separated labels of
// letters, digits, '-' and '_', not starting or ending with '-', the last
// one not all digits (which would be a mistyped IPv4 address).
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// checkRouteHost checks a route's host: a name, an IP address, or
// "*.suffix", each with an optional port.
func checkRouteHost(h string) string {
	name := h
	if host, port, err := net.SplitHostPort(h); err == nil {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strings.TrimLeft(port, "0123456789") != "" {
			return "port " + quote(port) + " out of range 1-65535"
		}
		name = host
	}
	if strings.HasPrefix(name, "*.") {
		name = name[2:]
		if strings.Contains(name, "*") {
			return "\"*\" may only be the first label, as in \"*.example.com\""
		}
	} else if strings.Contains(name, "*") {
		return "\"*\" may only be the first label, as in \"*.example.com\" (leave host out to match any host)"
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return ""
	}
	if !validHostname(name) {
		return "not a hostname (write it like \"example.com\" or \"*.example.com\")"
	}
	return ""
}

// normAddress returns a form of a valid listen address under which two
// addresses that bind the same socket are equal, or "" for port 0 (every
// port-0 listener gets a port of its own).
func normAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if p, _ := strconv.Atoi(port); p == 0 {
		return ""
	}
	port = strconv.Itoa(mustAtoi(port))
	if a, err := netip.ParseAddr(host); err == nil {
		if a.IsUnspecified() {
			host = "" // 0.0.0.0, :: and "" all mean every address
		} else {
			host = a.String()
		}
	} else {
		host = strings.ToLower(strings.TrimSuffix(host, "."))
	}
	return net.JoinHostPort(host, port)
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// orList writes "a, b or c".
func orList(l []string) string {
	if len(l) == 1 {
		return l[0]
	}
	return strings.Join(l[:len(l)-1], ", ") + " or " + l[len(l)-1]
}
