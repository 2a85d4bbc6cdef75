// Package config is hotproxy's configuration: the TOML file parsed into plain,
// deterministic data (the spec), checked as a whole before anything is built
// from it. Live objects (listeners, clusters) are built from a Config
// elsewhere, in a second step with errors of its own.
package config

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// Defaults, exported so that documentation and tests can name them.
const (
	DefaultDrainTime          = 30 * time.Second
	DefaultParentShutdownTime = 45 * time.Second
	DefaultAdminAddress       = "127.0.0.1:9901"
	DefaultConnectTimeout     = 5 * time.Second
	DefaultTCPIdleTimeout     = time.Hour
	DefaultHTTPIdleTimeout    = 60 * time.Second
	DefaultRequestTimeout     = 60 * time.Second
	DefaultHeaderTimeout      = 10 * time.Second
	DefaultWriteTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultUpstreamIdle       = 90 * time.Second
	DefaultMaxIdlePerEndpoint = 64
	DefaultDNSRefresh         = 5 * time.Second
	DefaultLogLevel           = "info"
	DefaultLogFormat          = "text"
	DefaultCommitWindow       = 5 * time.Second
	DefaultHandoffTimeout     = 10 * time.Second
	// DefaultMaxDrainingGenerations bounds the generations that drain at
	// once: with the serving one and one starting, at most 4 are alive,
	// the owner slots of a stats region created with the defaults.
	DefaultMaxDrainingGenerations = 2
	// DefaultStatsFileMode is the mode of a created stats region file:
	// a stats reader in the group can read it.
	DefaultStatsFileMode = "0640"
	// DefaultStatsFlushInterval is how often histograms are merged into
	// the stats region (and server.uptime, server.memory_allocated
	// refreshed).
	DefaultStatsFlushInterval = time.Second

	// Health checks, outlier detection and circuit breakers, when their
	// table is present; Envoy's circuit-breaker defaults.
	DefaultHealthCheckInterval         = time.Second
	DefaultHealthCheckTimeout          = 500 * time.Millisecond
	DefaultUnhealthyThreshold          = 2
	DefaultHealthyThreshold            = 1
	DefaultExpectedStatus              = 200
	DefaultConsecutive5xx              = 5
	DefaultConsecutiveConnectFailure   = 3
	DefaultBaseEjectionTime            = 30 * time.Second
	DefaultMaxEjectionPercent          = 50
	DefaultCircuitBreakerMaxConnection = 1024
	DefaultCircuitBreakerMaxPending    = 1024
	DefaultCircuitBreakerMaxRequests   = 1024
	DefaultCircuitBreakerMaxRetries    = 3
	// HealthCheckJitterPercent: each wait between two rounds of checks
	// is the interval plus a random share of it up to this, so that the
	// checks of many proxies do not arrive at an endpoint together.
	HealthCheckJitterPercent = 10
)

// Listener protocols.
const (
	ProtocolHTTP = "http"
	ProtocolTCP  = "tcp"
)

// Listener balance modes: how new connections are spread over the
// workers' SO_REUSEPORT sockets.
const (
	// BalanceLeastConn: an eBPF program picks the worker with the fewest
	// active connections (ties by flow hash), and moves a closing
	// socket's queue to a live one.
	BalanceLeastConn = "least_conn"
	// BalanceHash: the program picks by flow hash over the live workers,
	// and migrates like least_conn.
	BalanceHash = "hash"
	// BalanceKernel: no program; the kernel's own flow hash.
	BalanceKernel = "kernel"
	// DefaultBalance. Where the program cannot load (no CAP_BPF, a kernel
	// before 5.14, seccomp) a listener falls back to kernel, and says so
	// once in the log.
	DefaultBalance = BalanceLeastConn
)

// Load-balancing policies.
const (
	LBRoundRobin   = "round_robin"
	LBLeastRequest = "least_request"
	LBRandom       = "random"
	// LBRingHash and LBMaglev send requests with the same hash_on key to
	// the same endpoint, on every worker and every generation.
	LBRingHash = "ring_hash"
	LBMaglev   = "maglev"
)

// hash_on: what a ring_hash or maglev cluster hashes.
const (
	HashOnHeaderPrefix = "header:"   // "header:x-user": a request header's value
	HashOnCookiePrefix = "cookie:"   // "cookie:session": a cookie's value
	HashOnSourceIP     = "source_ip" // the client's IP address
)

// retry_on conditions (Envoy's names).
const (
	// RetryConnectFailure: every endpoint tried refused or timed out
	// at connect; nothing was sent.
	RetryConnectFailure = "connect-failure"
	// RetryReset: the upstream closed or reset the connection, or
	// per_try_timeout passed, before a response head.
	RetryReset = "reset"
	// Retry5xx: any 5xx response, and what RetryReset covers.
	Retry5xx = "5xx"
	// RetryGatewayError: a 502, 503 or 504 response, and a
	// per_try_timeout.
	RetryGatewayError = "gateway-error"
)

// RetryConditions lists every retry_on value.
var RetryConditions = []string{RetryConnectFailure, RetryReset, Retry5xx, RetryGatewayError}

// Access-log formats: AccessLogJSON writes one JSON object per line with
// every variable; anything else is a format string in which %NAME% is
// replaced by variable NAME (AccessLogVariables).
const (
	AccessLogJSON = "json"
	// DefaultAccessLogFormat is a one-line text format close to the
	// common log format, with the upstream and the duration.
	DefaultAccessLogFormat = `%CLIENT_IP% [%START_TIME%] "%METHOD% %PATH% %PROTOCOL%" %RESPONSE_CODE% %BYTES_SENT% %DURATION% %UPSTREAM_HOST% %RETRIES%`
	// DefaultAccessLogQueue is how many records wait for the writer
	// before new ones are dropped (and counted).
	DefaultAccessLogQueue = 4096
	// DefaultNumRetries applies to a route with retry_on and no
	// num_retries.
	DefaultNumRetries = 1
)

// AccessLogVariables are the %NAME% variables of an access-log format
// string, in the order a JSON line has them.
var AccessLogVariables = []string{
	"START_TIME",       // the request's first byte, RFC 3339 with milliseconds, UTC
	"CLIENT_IP",        // the client's address
	"METHOD",           // the request method
	"PATH",             // the request target as received (truncated past 512 bytes)
	"PROTOCOL",         // HTTP/1.1 or HTTP/1.0
	"RESPONSE_CODE",    // the status sent to the client (0: none was sent)
	"BYTES_RECEIVED",   // request body bytes announced (Content-Length; -1 chunked)
	"BYTES_SENT",       // response bytes written to the client, head included
	"DURATION",         // milliseconds from the first byte to the response's end
	"UPSTREAM_CLUSTER", // the route's cluster ("-": none)
	"UPSTREAM_HOST",    // the endpoint that answered ("-": none)
	"RETRIES",          // retries made (retry_on and stale connections)
	"LISTENER",         // the listener's name
	"EPOCH",            // the generation that served the request
}

// Config is one whole hotproxy configuration.
type Config struct {
	Server Server `toml:"server" json:"server"`
	Admin  Admin  `toml:"admin" json:"admin"`
	Log    Log    `toml:"log" json:"log"`
	// HotRestart configures the hand-over between generations.
	HotRestart HotRestart `toml:"hot_restart" json:"hot_restart"`
	// Stats configures the shared-memory stats region.
	Stats Stats `toml:"stats" json:"stats"`
	// Watchdog configures the liveness checks of a generation's loops
	// and the supervisor's watch over the serving generation.
	Watchdog Watchdog `toml:"watchdog" json:"watchdog"`
	// Overload configures the overload manager (overload.go); off unless
	// an action is configured.
	Overload Overload `toml:"overload" json:"overload"`
	// XDS configures dynamic configuration from a control plane over
	// xDS (xds.go); off unless cluster is set.
	XDS       XDS        `toml:"xds" json:"xds"`
	Listeners []Listener `toml:"listeners" json:"listeners"`
	Clusters  []Cluster  `toml:"clusters" json:"clusters"`

	// Source names where the config came from ("<embedded default>" or a
	// path); every error message starts with it.
	Source string `toml:"-" json:"source"`
}

// Server holds process-wide settings.
type Server struct {
	// Concurrency is the number of workers; 0 means one per CPU this
	// process may run on.
	Concurrency int `toml:"concurrency" json:"concurrency" bound:"0..MaxConcurrency" note:"0, the default, means one worker per CPU this process may run on"`
	// DrainTime bounds a drain: keep-alive connections are closed and
	// in-flight HTTP requests must finish within it.
	DrainTime Duration `toml:"drain_time" json:"drain_time" default:"30s" bound:"100ms..24h"`
	// ParentShutdownTime bounds how long a draining generation may keep
	// long-lived (TCP-proxy) connections before it exits.
	ParentShutdownTime Duration `toml:"parent_shutdown_time" json:"parent_shutdown_time" bound:"100ms..168h"`
	// ReusePort gives every worker its own SO_REUSEPORT socket per listener
	// (default true on Linux); false shares one socket among all workers.
	ReusePort *bool `toml:"reuse_port" json:"reuse_port" default:"true"`
	// MaxConnections bounds the client connections of all listeners
	// together; 0 derives it from the open-file limit, keeping a reserve
	// of descriptors for the admin API, the restart socket and upstream
	// connections.
	MaxConnections int `toml:"max_connections,omitzero" json:"max_connections" bound:"0..MaxConnectionsLimit" note:"0, the default, derives the bound from the open-file limit"`
	// TimerSlack is how late the kernel may end a timed sleep of this
	// process's threads (Linux timer slack, PR_SET_TIMERSLACK; the
	// kernel's default is 50us). The Go runtime's sysmon sleeps 20us at a
	// time while the process is busy, and each wake-up on a busy core
	// preempts a worker (and takes the P from a system call that outlasts
	// two of them); 1ms lets it wake a twentieth as often, for timers at
	// most that much later. "50us" is the kernel's default.
	TimerSlack Duration `toml:"timer_slack" json:"timer_slack" default:"1ms" bound:"1us..100ms"`
}

// Admin is the admin API's listener.
type Admin struct {
	Address string `toml:"address" json:"address" default:"127.0.0.1:9901"`
	// AllowRemote lets Address be other than a loopback address. The
	// admin API has no authentication and can drain and stop the proxy,
	// so exposing it beyond this host must be a decision, not a typo.
	AllowRemote bool `toml:"allow_remote" json:"allow_remote"`
}

// Loopback reports whether Address binds loopback only: a loopback IP
// address, or the name localhost.
func (a Admin) Loopback() bool { return loopbackAddress(a.Address) }

// HotRestart configures how the next generation takes over from this one.
type HotRestart struct {
	// SocketDir, when set, puts the restart socket in this directory
	// (hotproxy.<base-id>.<epoch>.sock, mode 0600) instead of the
	// abstract namespace (@hotproxy.<base-id>.<epoch>), which any process
	// in the network namespace can reach (peers are still checked by uid).
	SocketDir string `toml:"socket_dir,omitempty" json:"socket_dir,omitempty"`
	// CommitWindow is how long after the next generation is ready this
	// one keeps its listening sockets, ready to serve again if the next
	// one dies.
	CommitWindow Duration `toml:"commit_window" json:"commit_window" default:"5s" bound:"10ms..1h"`
	// HandoffTimeout bounds each step of the hand-over (connect, hello,
	// sockets) and the wait for the next generation to become ready.
	HandoffTimeout Duration `toml:"handoff_timeout" json:"handoff_timeout" default:"10s" bound:"100ms..1h"`
	// MaxDrainingGenerations bounds the generations draining at once
	// (reloads may come faster than generations drain); past it the
	// supervisor hurries the oldest draining one: it stops as on SIGTERM,
	// its in-flight requests get drain_time. Never a serving one. With the
	// serving one and one starting, at most MaxDrainingGenerations+2
	// generations are alive; a reload that would exceed that waits for a
	// hurried one to exit.
	MaxDrainingGenerations int `toml:"max_draining_generations" json:"max_draining_generations" default:"2" bound:"1..62" note:"past it the oldest draining generation is hurried"`
	// KeepListeners makes the supervisor keep a duplicate of every
	// listening socket of the serving generation, so that when it dies
	// or wedges the next generation takes over the same sockets and the
	// connections queued in them; false starts the next one cold on
	// sockets of its own (queued connections are reset).
	KeepListeners *bool `toml:"keep_listeners" json:"keep_listeners" default:"true"`
}

// KeepListenersEnabled reports keep_listeners (true when left out).
func (h HotRestart) KeepListenersEnabled() bool { return h.KeepListeners == nil || *h.KeepListeners }

// Watchdog configures the liveness checks: the main goroutine and every
// worker's accept loop store a heartbeat; a watchdog goroutine counts the
// loops whose heartbeat is older than MissTimeout (watchdog.miss) or
// MegaMissTimeout (watchdog.mega_miss), and can abort the generation. The
// supervisor watches the generation's heartbeat in the stats region.
type Watchdog struct {
	// MissTimeout: a heartbeat older than this is a miss.
	MissTimeout Duration `toml:"miss_timeout" json:"miss_timeout" default:"200ms" bound:"10ms..1h"`
	// MegaMissTimeout: a heartbeat older than this is a mega miss.
	MegaMissTimeout Duration `toml:"mega_miss_timeout" json:"mega_miss_timeout" default:"1s" bound:"10ms..24h"`
	// KillTimeout: a heartbeat older than this aborts the generation,
	// every goroutine's stack in the log. 0 (or left out), the default,
	// never does.
	KillTimeout Duration `toml:"kill_timeout,omitzero" json:"kill_timeout,omitempty" bound:"10ms..24h"`
	// SupervisorTimeout: the supervisor treats a serving generation whose
	// heartbeat in the stats region is older than this as wedged, and
	// replaces it.
	SupervisorTimeout Duration `toml:"supervisor_timeout" json:"supervisor_timeout" default:"30s" bound:"250ms..24h"`
}

// Stats configures the shared-memory stats region that every generation of
// a base-id counts into.
type Stats struct {
	// Path of the region file. Empty: /dev/shm/hotproxy.<base-id>.stats.
	Path string `toml:"path,omitempty" json:"path,omitempty"`
	// FileMode is the mode of a created region file, in octal ("0640").
	FileMode string `toml:"file_mode" json:"file_mode" default:"0640"`
	// FlushInterval is how often histograms are merged into the region.
	FlushInterval Duration `toml:"flush_interval" json:"flush_interval" default:"1s" bound:"10ms..5m"`
}

// Mode returns FileMode as a file mode; a FileMode that does not parse
// (Validate rejects it) gives DefaultStatsFileMode.
func (s Stats) Mode() os.FileMode {
	m, err := parseFileMode(s.FileMode)
	if err != nil {
		m, _ = parseFileMode(DefaultStatsFileMode)
	}
	return m
}

// parseFileMode parses an octal permission mode from "0000" to "0777".
func parseFileMode(s string) (os.FileMode, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || s == "" {
		return 0, fmt.Errorf("not an octal mode (write it like \"0640\")")
	}
	if v > 0o777 {
		return 0, fmt.Errorf("out of range 0000-0777 (permission bits only)")
	}
	return os.FileMode(v), nil
}

// Log configures the process logger.
type Log struct {
	Level  string `toml:"level" json:"level" default:"info"`   // trace, debug, info, warn, error
	Format string `toml:"format" json:"format" default:"text"` // text or json
	// Path is the file the process log is appended to (O_APPEND, created
	// 0640), by the supervisor and every generation alike, and opened
	// again on SIGUSR1 after logrotate moved it. "" (the default) is
	// standard error, for systemd's journal or a container runtime.
	Path string `toml:"path,omitempty" json:"path,omitempty"`
}

// Listener is one listening address and what to do with its connections.
type Listener struct {
	Name     string `toml:"name" json:"name"`
	Address  string `toml:"address" json:"address"`
	Protocol string `toml:"protocol" json:"protocol"` // http or tcp

	// Cluster is where a tcp listener sends its connections.
	Cluster string `toml:"cluster,omitempty" json:"cluster,omitempty"`
	// Routes are an http listener's routes, first match wins.
	Routes []Route `toml:"routes,omitempty" json:"routes,omitempty"`

	// IdleTimeout closes a connection with no traffic for this long
	// (tcp: either direction; http: between requests on a keep-alive
	// connection).
	IdleTimeout Duration `toml:"idle_timeout" json:"idle_timeout" bound:"100ms..168h"`
	// RequestTimeout bounds one HTTP request from its first byte to the
	// end of the response headers from upstream.
	RequestTimeout Duration `toml:"request_timeout,omitzero" json:"request_timeout,omitempty" default:"60s" bound:"10ms..24h" only:"http"`
	// HeaderTimeout bounds reading a request's headers (slowloris).
	HeaderTimeout Duration `toml:"header_timeout,omitzero" json:"header_timeout,omitempty" default:"10s" bound:"10ms..1h" only:"http"`
	// MaxHeaderBytes bounds a request's header block; larger gets 431.
	MaxHeaderBytes int `toml:"max_header_bytes,omitzero" json:"max_header_bytes,omitempty" default:"65536" bound:"1024..1048576" only:"http"`
	// WriteTimeout closes an HTTP connection whose client has not taken
	// any of a response's bytes for this long (a client that stops
	// reading holds no buffers and no upstream connection forever).
	WriteTimeout Duration `toml:"write_timeout,omitzero" json:"write_timeout,omitempty" default:"60s" bound:"10ms..24h" only:"http"`
	// TrustForwardedFor keeps the client's X-Forwarded-For chain and
	// appends the client's address; false replaces it with the client's
	// address alone (a proxy at the edge). Default true.
	TrustForwardedFor *bool `toml:"trust_forwarded_for" json:"trust_forwarded_for,omitempty" default:"true" only:"http"`
	// MaxConnections bounds this listener's open client connections;
	// past it, new connections are accepted and closed at once, and
	// counted. 0: only the server-wide bound applies.
	MaxConnections int `toml:"max_connections,omitzero" json:"max_connections" bound:"0..MaxConnectionsLimit" note:"0, the default, leaves only [server] max_connections"`
	// Balance is how new connections are spread over the workers'
	// sockets: BalanceLeastConn, BalanceHash or BalanceKernel. It needs
	// server.reuse_port (one socket per worker).
	Balance string `toml:"balance" json:"balance" default:"least_conn"`
	// AccessLog lists an http listener's access logs: one line per
	// request, written by a goroutine of its own.
	AccessLog []AccessLog `toml:"access_log,omitempty" json:"access_log,omitempty" only:"http"`

	// TLS, when set, terminates TLS on the listener (tls.go).
	TLS *ListenerTLS `toml:"tls,omitempty" json:"tls,omitempty"`
	// SNIRoutes make a tcp listener pass TLS through untouched, to the
	// cluster of the first route naming the ClientHello's SNI; Cluster,
	// when set, takes the connections no route names (and those without
	// a ClientHello's SNI).
	SNIRoutes []SNIRoute `toml:"sni_routes,omitempty" json:"sni_routes,omitempty"`
	// HTTP2Cleartext lets an http listener without TLS serve HTTP/2 to
	// clients that open with its connection preface (prior knowledge,
	// "h2c"), besides HTTP/1.1.
	HTTP2Cleartext bool `toml:"http2_cleartext,omitzero" json:"http2_cleartext,omitempty"`
	// ParkIdleConnections makes an idle HTTP/1.1 keep-alive connection
	// without TLS give its goroutine back and wait in its worker's epoll
	// (Linux) once it has been idle for a quarter of a second: 0.7 to 2.8
	// KB of memory per idle connection instead of 6, and nothing per busy
	// keep-alive request, whose client sends again sooner
	// (docs/benchmarks.md). Default true on a listener without TLS; a
	// listener with TLS cannot park (ListenerParksIdle).
	ParkIdleConnections *bool `toml:"park_idle_connections" json:"park_idle_connections,omitempty" only:"http"`
}

// Cluster is a named group of upstream endpoints.
type Cluster struct {
	Name      string   `toml:"name" json:"name"`
	LBPolicy  string   `toml:"lb_policy" json:"lb_policy" default:"round_robin"`
	Endpoints []string `toml:"endpoints" json:"endpoints"`
	// HashOn is the key of ring_hash and maglev: "header:NAME",
	// "cookie:NAME" or "source_ip". A request without the key goes to
	// an endpoint picked at random.
	HashOn string `toml:"hash_on,omitempty" json:"hash_on,omitempty"`

	ConnectTimeout Duration `toml:"connect_timeout" json:"connect_timeout" default:"5s" bound:"10ms..5m"`
	// IdleTimeout closes pooled upstream keep-alive connections idle for
	// this long.
	IdleTimeout Duration `toml:"idle_timeout" json:"idle_timeout" default:"90s" bound:"100ms..24h"`
	// MaxIdlePerEndpoint bounds each worker's keep-alive pool per endpoint.
	MaxIdlePerEndpoint *int `toml:"max_idle_per_endpoint" json:"max_idle_per_endpoint" default:"64" bound:"0..65535" note:"0 keeps no idle connections; leave it out for the default, %v"`
	// DNSRefresh is how often an endpoint given by host name is resolved
	// again (on the main side); a name that stops resolving keeps its
	// last good address.
	DNSRefresh Duration `toml:"dns_refresh" json:"dns_refresh" default:"5s" bound:"100ms..24h"`

	// HealthCheck, when set, checks every endpoint actively; nil: every
	// endpoint counts as healthy (outlier detection may still eject).
	HealthCheck *HealthCheck `toml:"health_check,omitempty" json:"health_check,omitempty"`
	// OutlierDetection, when set, ejects endpoints that fail requests.
	OutlierDetection *OutlierDetection `toml:"outlier_detection,omitempty" json:"outlier_detection,omitempty"`
	// CircuitBreakers, when set, bounds what the cluster is asked to
	// carry at once; past a bound a request is answered 503 at once.
	CircuitBreakers *CircuitBreakers `toml:"circuit_breakers,omitempty" json:"circuit_breakers,omitempty"`

	// TLS, when set, makes upstream connections TLS (tls.go).
	TLS *ClusterTLS `toml:"tls,omitempty" json:"tls,omitempty"`
	// HTTP2 speaks HTTP/2 to the endpoints: over TLS (ALPN h2) when TLS
	// is set, else cleartext with prior knowledge. Default HTTP/1.1.
	HTTP2 bool `toml:"http2,omitzero" json:"http2,omitempty"`
}

// Duration is a time.Duration written as a string ("30s", "1m30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("invalid duration %q (write it like \"500ms\", \"30s\" or \"1m\")", text)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes d back as a string.
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

// ReusePortEnabled reports whether workers get one SO_REUSEPORT socket each.
func (s Server) ReusePortEnabled() bool { return s.ReusePort == nil || *s.ReusePort }

// Listener returns the listener named name, or nil.
func (c *Config) Listener(name string) *Listener {
	for i := range c.Listeners {
		if c.Listeners[i].Name == name {
			return &c.Listeners[i]
		}
	}
	return nil
}

// Cluster returns the cluster named name, or nil.
func (c *Config) Cluster(name string) *Cluster {
	for i := range c.Clusters {
		if c.Clusters[i].Name == name {
			return &c.Clusters[i]
		}
	}
	return nil
}
