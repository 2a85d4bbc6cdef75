package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Default is the config used when no file is given: an HTTP listener on
// 127.0.0.1:10000 that answers every request itself, and the admin API on
// DefaultAdminAddress.
//
//go:embed default.toml
var Default []byte

// DefaultSource is the Source of the embedded default config.
const DefaultSource = "<embedded default>"

// Load reads, parses and validates the config file at path; path "" loads
// the embedded Default. Errors that concern the config match ErrInvalid.
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(Default, DefaultSource)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes data strictly (unknown keys and values of the wrong type
// are errors), fills in defaults and validates the result. source names
// the data in errors and becomes Config.Source. The error, if any, is an
// *Error that lists every problem found.
func Parse(data []byte, source string) (*Config, error) {
	// First pass: into generic maps, to find syntax errors, and, against
	// the schema, unknown keys and wrong types, all of them, with indices.
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil, syntaxError(source, data, err)
	}
	ch := checker{homes: homesOf(rootSchema(), nil)}
	ch.check(rootSchema(), raw, "")
	ps := ch.problems
	if ch.badType {
		ps.locate(data)
		return nil, ps.err(source)
	}

	// Second pass: into the types.
	var c Config
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		// The first pass should have caught it; report what the decoder says.
		ps.add("", "%s", strings.TrimPrefix(err.Error(), "toml: "))
		return nil, ps.err(source)
	}
	if len(ps) == 0 {
		for _, k := range md.Undecoded() {
			ps.add("", "unknown key %q", k.String())
		}
	}
	c.Source = source
	c.normalize()
	c.resolveFiles(source)
	c.setDefaults(raw)
	if err := c.Validate(); err != nil {
		var e *Error
		if errors.As(err, &e) {
			ps = append(ps, e.Problems...)
		} else {
			ps.add("", "%v", err)
		}
	}
	if len(ps) > 0 {
		ps.locate(data)
		return nil, ps.err(source)
	}
	return &c, nil
}

func syntaxError(source string, data []byte, err error) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return &Error{Source: source, Problems: []Problem{{Msg: strings.TrimPrefix(err.Error(), "toml: ")}}}
	}
	p := Problem{
		Line:   pe.Position.Line,
		Column: pe.Position.Col,
		Msg:    "syntax error: " + pe.Message,
	}
	p.Context = errorContext(pe, data)
	return &Error{Source: source, Problems: []Problem{p}}
}

// errorContext returns the lines of data around a syntax error, from
// ErrorWithPosition, or "" when the position is unusable.
func errorContext(pe toml.ParseError, data []byte) (ctx string) {
	// toml v1.6.0's ErrorWithPosition indexes out of range when the
	// position is off the input (Line 0 for `"\` at the end of a file):
	// check the position, and recover in case of another such bug, so that
	// a bad file gets an error message and never crashes the process.
	pos := pe.Position
	if pos.Line < 1 || pos.Line > bytes.Count(data, []byte("\n"))+1 || pos.Col < 1 || pos.Len < 0 {
		return ""
	}
	defer func() {
		if recover() != nil {
			ctx = ""
		}
	}()
	// ErrorWithPosition is "toml: error: MSG\n\nAt line L, column C:\n\n"
	// and then the lines around the error; keep those lines.
	full := pe.ErrorWithPosition()
	if i := strings.Index(full, "\n\nAt line "); i >= 0 {
		if _, c, ok := strings.Cut(full[i:], ":\n\n"); ok {
			return c
		}
	}
	return ""
}

// normalize makes empty lists nil, so that equal configs are deeply equal
// however they were written.
func (c *Config) normalize() {
	if len(c.Listeners) == 0 {
		c.Listeners = nil
	}
	if len(c.Clusters) == 0 {
		c.Clusters = nil
	}
	for i := range c.Listeners {
		if len(c.Listeners[i].Routes) == 0 {
			c.Listeners[i].Routes = nil
		}
	}
	for i := range c.Clusters {
		if len(c.Clusters[i].Endpoints) == 0 {
			c.Clusters[i].Endpoints = nil
		}
		if hc := c.Clusters[i].HealthCheck; hc != nil && len(hc.ExpectedStatuses) == 0 {
			hc.ExpectedStatuses = nil
		}
	}
}

// SetDefaults fills in the default of every setting left at its zero
// value. Parse does this itself (and there, a zero written out in the file
// stays, and Validate rejects it); SetDefaults is for configs built in code.
func (c *Config) SetDefaults() { c.setDefaults(nil) }

// setDefaults fills in defaults for the keys not given in raw, the generic
// decoding of the file; with raw nil, for every zero value.
func (c *Config) setDefaults(raw map[string]any) {
	given := func(m map[string]any, key string, zero bool) bool {
		if raw == nil {
			return !zero
		}
		_, ok := m[key]
		return ok
	}
	server, admin, log := subTable(raw, "server"), subTable(raw, "admin"), subTable(raw, "log")
	hotRestart, st := subTable(raw, "hot_restart"), subTable(raw, "stats")

	s := &c.Server
	if !given(server, "drain_time", s.DrainTime == 0) {
		s.DrainTime = Duration(DefaultDrainTime)
	}
	if !given(server, "parent_shutdown_time", s.ParentShutdownTime == 0) {
		s.ParentShutdownTime = defaultParentShutdown(s.DrainTime)
	}
	if !given(server, "reuse_port", s.ReusePort == nil) {
		reuse := true
		s.ReusePort = &reuse
	}
	if !given(hotRestart, "commit_window", c.HotRestart.CommitWindow == 0) {
		c.HotRestart.CommitWindow = Duration(DefaultCommitWindow)
	}
	if !given(hotRestart, "handoff_timeout", c.HotRestart.HandoffTimeout == 0) {
		c.HotRestart.HandoffTimeout = Duration(DefaultHandoffTimeout)
	}
	if !given(hotRestart, "max_draining_generations", c.HotRestart.MaxDrainingGenerations == 0) {
		c.HotRestart.MaxDrainingGenerations = DefaultMaxDrainingGenerations
	}
	if !given(st, "file_mode", c.Stats.FileMode == "") {
		c.Stats.FileMode = DefaultStatsFileMode
	}
	if !given(st, "flush_interval", c.Stats.FlushInterval == 0) {
		c.Stats.FlushInterval = Duration(DefaultStatsFlushInterval)
	}
	if !given(admin, "address", c.Admin.Address == "") {
		c.Admin.Address = DefaultAdminAddress
	}
	if !given(log, "level", c.Log.Level == "") {
		c.Log.Level = DefaultLogLevel
	}
	if !given(log, "format", c.Log.Format == "") {
		c.Log.Format = DefaultLogFormat
	}

	rawListeners := tables(raw, "listeners")
	for i := range c.Listeners {
		l := &c.Listeners[i]
		m := tableAt(rawListeners, i)
		switch l.Protocol {
		case ProtocolTCP:
			if !given(m, "idle_timeout", l.IdleTimeout == 0) {
				l.IdleTimeout = Duration(DefaultTCPIdleTimeout)
			}
		case ProtocolHTTP:
			if !given(m, "idle_timeout", l.IdleTimeout == 0) {
				l.IdleTimeout = Duration(DefaultHTTPIdleTimeout)
			}
			if !given(m, "request_timeout", l.RequestTimeout == 0) {
				l.RequestTimeout = Duration(DefaultRequestTimeout)
			}
			if !given(m, "header_timeout", l.HeaderTimeout == 0) {
				l.HeaderTimeout = Duration(DefaultHeaderTimeout)
			}
			if !given(m, "max_header_bytes", l.MaxHeaderBytes == 0) {
				l.MaxHeaderBytes = DefaultMaxHeaderBytes
			}
			if !given(m, "write_timeout", l.WriteTimeout == 0) {
				l.WriteTimeout = Duration(DefaultWriteTimeout)
			}
			if !given(m, "trust_forwarded_for", l.TrustForwardedFor == nil) {
				trust := true
				l.TrustForwardedFor = &trust
			}
			rawRoutes := tables(m, "routes")
			for j := range l.Routes {
				r := &l.Routes[j]
				rm := tableAt(rawRoutes, j)
				if r.Cluster == "" {
					continue // a direct_response is never retried
				}
				if len(r.RetryOn) > 0 && !given(rm, "num_retries", r.NumRetries == 0) {
					r.NumRetries = DefaultNumRetries
				}
			}
			rawLogs := tables(m, "access_log")
			for j := range l.AccessLog {
				al := &l.AccessLog[j]
				am := tableAt(rawLogs, j)
				if !given(am, "format", al.Format == "") {
					al.Format = DefaultAccessLogFormat
				}
				if !given(am, "queue_size", al.QueueSize == 0) {
					al.QueueSize = DefaultAccessLogQueue
				}
			}
		}
		if !given(m, "balance", l.Balance == "") {
			l.Balance = DefaultBalance
		}
		if t := l.TLS; t != nil {
			tm := subTable(m, "tls")
			if !given(tm, "min_version", t.MinVersion == "") {
				t.MinVersion = DefaultTLSMinVersion
			}
			if !given(tm, "max_version", t.MaxVersion == "") {
				t.MaxVersion = DefaultTLSMaxVersion
			}
			if !given(tm, "alpn", t.ALPN == nil) && l.Protocol == ProtocolHTTP {
				t.ALPN = slices.Clone(DefaultHTTPALPN)
			}
			if !given(tm, "session_ticket_rotation", t.SessionTicketRotation == 0) {
				t.SessionTicketRotation = Duration(DefaultSessionTicketRotation)
			}
			if !given(tm, "handshake_timeout", t.HandshakeTimeout == 0) {
				t.HandshakeTimeout = Duration(DefaultHandshakeTimeout)
			}
		}
		// max_connections stays 0 when left out: 0 is the default and
		// means "no bound of this listener's own".
	}

	rawClusters := tables(raw, "clusters")
	for i := range c.Clusters {
		cl := &c.Clusters[i]
		m := tableAt(rawClusters, i)
		if !given(m, "lb_policy", cl.LBPolicy == "") {
			cl.LBPolicy = LBRoundRobin
		}
		if !given(m, "connect_timeout", cl.ConnectTimeout == 0) {
			cl.ConnectTimeout = Duration(DefaultConnectTimeout)
		}
		if !given(m, "idle_timeout", cl.IdleTimeout == 0) {
			cl.IdleTimeout = Duration(DefaultUpstreamIdle)
		}
		// 0 is meaningful (keep no idle connections), so only a key left
		// out gets the default; in code, SetDefaults cannot tell.
		if !given(m, "max_idle_per_endpoint", cl.MaxIdlePerEndpoint == 0) {
			cl.MaxIdlePerEndpoint = DefaultMaxIdlePerEndpoint
		}
		if !given(m, "dns_refresh", cl.DNSRefresh == 0) {
			cl.DNSRefresh = Duration(DefaultDNSRefresh)
		}
		setResilienceDefaults(cl, m, given)
		if t := cl.TLS; t != nil && !given(subTable(m, "tls"), "min_version", t.MinVersion == "") {
			t.MinVersion = DefaultTLSMinVersion
		}
	}
}

// setResilienceDefaults fills in the defaults of a cluster's health_check,
// outlier_detection and circuit_breakers tables, when they are present;
// m is the cluster's table in the file (nil: set every zero value).
func setResilienceDefaults(cl *Cluster, m map[string]any, given func(map[string]any, string, bool) bool) {
	if hc := cl.HealthCheck; hc != nil {
		t := subTable(m, "health_check")
		if !given(t, "expected_statuses", len(hc.ExpectedStatuses) == 0) {
			hc.ExpectedStatuses = []int{DefaultExpectedStatus}
		}
		if !given(t, "interval", hc.Interval == 0) {
			hc.Interval = Duration(DefaultHealthCheckInterval)
		}
		if !given(t, "timeout", hc.Timeout == 0) {
			hc.Timeout = Duration(DefaultHealthCheckTimeout)
		}
		if !given(t, "unhealthy_threshold", hc.UnhealthyThreshold == 0) {
			hc.UnhealthyThreshold = DefaultUnhealthyThreshold
		}
		if !given(t, "healthy_threshold", hc.HealthyThreshold == 0) {
			hc.HealthyThreshold = DefaultHealthyThreshold
		}
	}
	if od := cl.OutlierDetection; od != nil {
		t := subTable(m, "outlier_detection")
		// 0 disables a trigger, so only a key left out gets the default.
		if !given(t, "consecutive_5xx", od.Consecutive5xx == 0) {
			od.Consecutive5xx = DefaultConsecutive5xx
		}
		if !given(t, "consecutive_connect_failure", od.ConsecutiveConnectFailure == 0) {
			od.ConsecutiveConnectFailure = DefaultConsecutiveConnectFailure
		}
		if !given(t, "base_ejection_time", od.BaseEjectionTime == 0) {
			od.BaseEjectionTime = Duration(DefaultBaseEjectionTime)
		}
		if !given(t, "max_ejection_percent", od.MaxEjectionPercent == 0) {
			od.MaxEjectionPercent = DefaultMaxEjectionPercent
		}
	}
	if cb := cl.CircuitBreakers; cb != nil {
		t := subTable(m, "circuit_breakers")
		if !given(t, "max_connections", cb.MaxConnections == 0) {
			cb.MaxConnections = DefaultCircuitBreakerMaxConnection
		}
		if !given(t, "max_pending_requests", cb.MaxPendingRequests == 0) {
			cb.MaxPendingRequests = DefaultCircuitBreakerMaxPending
		}
		if !given(t, "max_requests", cb.MaxRequests == 0) {
			cb.MaxRequests = DefaultCircuitBreakerMaxRequests
		}
		if !given(t, "max_retries", cb.MaxRetries == 0) {
			cb.MaxRetries = DefaultCircuitBreakerMaxRetries
		}
	}
}

// defaultParentShutdown is DefaultParentShutdownTime, or one and a half
// times drain when that is longer, so that raising drain_time alone does
// not make the config invalid. It stays within the bounds of
// parent_shutdown_time, so that a drain_time out of range is the one
// problem reported, not two.
func defaultParentShutdown(drain Duration) Duration {
	p := Duration(DefaultParentShutdownTime)
	if drain > p {
		p = drain + min(drain/2, math.MaxInt64-drain)
	}
	return min(p, Duration(durationBounds["server.parent_shutdown_time"].max))
}

// durationString is d as written back: "1m30s".
func durationString(d Duration) string { return time.Duration(d).String() }
