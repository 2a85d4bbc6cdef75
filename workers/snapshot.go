package workers

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/upstream"
)

// Concurrency resolves the number of workers for cfg: server.concurrency
// when it is positive, otherwise the CPUs this process may run on
// (runtime.NumCPU honours the affinity mask the process started with).
func Concurrency(cfg *config.Config) int {
	if cfg != nil && cfg.Server.Concurrency > 0 {
		return cfg.Server.Concurrency
	}
	return runtime.NumCPU()
}

// Snapshot is everything a worker needs to serve, built by the main thread
// from a validated config and never changed afterwards. Connections keep
// the snapshot they started with.
type Snapshot struct {
	cfg       *config.Config
	id        Identity
	listeners map[string]*listenerSnap // by listener name
	clusters  map[string]*upstream.Cluster
	// views[w] is worker w's view of every cluster, by name.
	views []map[string]*upstream.WorkerCluster
}

// Clusters returns the snapshot's clusters, sorted by name: the main side
// runs their health monitors and the admin API shows them. (Added for
// upstream resilience, issue 12.)
func (s *Snapshot) Clusters() []*upstream.Cluster {
	out := make([]*upstream.Cluster, 0, len(s.clusters))
	for _, c := range s.clusters {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *upstream.Cluster) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Workers is the number of workers the snapshot has views for.
func (s *Snapshot) Workers() int { return len(s.views) }

// Config is the config the snapshot was built from.
func (s *Snapshot) Config() *config.Config { return s.cfg }

// listenerSnap is one compiled listener, shared by all workers (immutable).
type listenerSnap struct {
	name           string
	protocol       string
	cluster        string     // tcp; "" for a passthrough listener without a default cluster
	tcpHashOn      hashSource // tcp: its cluster's hash_on (only source_ip applies)
	routes         []*route
	idleTimeout    time.Duration
	requestTimeout time.Duration

	// TLS passthrough (tcp, sni_routes; sni.go): the routes, and how long
	// a client may take to send its ClientHello.
	sniRoutes    []sniRoute
	helloTimeout time.Duration
}

// sniRoute is a compiled sni_routes entry.
type sniRoute struct {
	serverNames []hostPattern
	cluster     string
	hashOn      hashSource
}

type hostMatch uint8

const (
	hostAny hostMatch = iota
	hostExact
	hostWildcard // host holds ".example.com"
)

// route is one compiled route. Exactly one of cluster and direct is set.
type route struct {
	index   int
	hostKin hostMatch
	host    string // lower case, no port
	path    string
	prefix  bool
	cluster string
	direct  *directResponse
	connect bool // CONNECT requests may tunnel through it
	// serverName matches the TLS connection's SNI (any: server_name is
	// not set).
	serverName hostPattern

	// For a cluster: the route's timeout (0: the listener's
	// request_timeout), its retry policy, and what its cluster hashes.
	timeout time.Duration
	retry   retryPolicy
	hashOn  hashSource
	http2   bool // its cluster speaks HTTP/2 (clusters.http2)
}

// retryPolicy is a route's retry_on, compiled.
type retryPolicy struct {
	on            retryOn
	num           int           // retries of one request at most
	perTry        time.Duration // 0: no bound per try
	nonIdempotent bool          // retry_non_idempotent
}

type retryOn uint8

const (
	retryConnectFailure retryOn = 1 << iota
	retryReset
	retry5xx
	retryGatewayError
)

// hashSource is a cluster's hash_on, compiled: where the data path finds
// a request's key.
type hashSource struct {
	kind hashKind
	name string // header name (matched without case) or cookie name
}

type hashKind uint8

const (
	hashNone hashKind = iota
	hashHeader
	hashCookie
	hashSourceIP
)

// directResponse is a direct_response with placeholders already replaced
// and its headers prebuilt.
type directResponse struct {
	status int
	body   []byte
	// Header values shared by every response: len == cap, so an
	// Add on a response's header copies instead of writing into them.
	contentType   []string
	contentLength []string
}

// BuildSnapshot compiles routes and builds clusters from cfg (already
// validated by config.Load). It touches no socket: this is the fail-fast
// build step. An error names the listener, route or cluster at fault.
//
// The snapshot has a view for each of Concurrency(cfg) workers; use
// BuildSnapshotN when the worker count is resolved another way.
func BuildSnapshot(cfg *config.Config, id Identity) (*Snapshot, error) {
	return BuildSnapshotN(cfg, id, Concurrency(cfg))
}

// BuildSnapshotN is BuildSnapshot for exactly workers workers: every
// cluster is built once with upstream.NewCluster, then viewed with
// ForWorker(w) for w in [0, workers).
func BuildSnapshotN(cfg *config.Config, id Identity, workers int) (*Snapshot, error) {
	if cfg == nil {
		return nil, fmt.Errorf("workers: nil config")
	}
	if workers < 1 {
		return nil, fmt.Errorf("server: concurrency %d: need at least one worker", workers)
	}
	s := &Snapshot{
		cfg:       cfg,
		id:        id,
		listeners: make(map[string]*listenerSnap, len(cfg.Listeners)),
		clusters:  make(map[string]*upstream.Cluster, len(cfg.Clusters)),
	}
	for _, cs := range cfg.Clusters {
		if _, dup := s.clusters[cs.Name]; dup {
			return nil, fmt.Errorf("cluster %q: defined twice", cs.Name)
		}
		c, err := upstream.NewCluster(cs)
		if err != nil {
			// upstream's errors already start with `cluster "name":`.
			return nil, err
		}
		s.clusters[cs.Name] = c
	}
	replacer := strings.NewReplacer(
		"%VERSION%", id.Version,
		"%EPOCH%", strconv.Itoa(id.Epoch),
		"%PID%", strconv.Itoa(id.PID),
		"%HOSTNAME%", id.Hostname,
	)
	for i := range cfg.Listeners {
		l := &cfg.Listeners[i]
		if _, dup := s.listeners[l.Name]; dup {
			return nil, fmt.Errorf("listener %q: defined twice", l.Name)
		}
		ls, err := s.compileListener(l, replacer)
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", l.Name, err)
		}
		s.listeners[l.Name] = ls
	}
	s.views = make([]map[string]*upstream.WorkerCluster, workers)
	for w := range s.views {
		m := make(map[string]*upstream.WorkerCluster, len(s.clusters))
		for name, c := range s.clusters {
			m[name] = c.ForWorker(w)
		}
		s.views[w] = m
	}
	return s, nil
}

func (s *Snapshot) compileListener(l *config.Listener, rep *strings.Replacer) (*listenerSnap, error) {
	ls := &listenerSnap{
		name:           l.Name,
		protocol:       l.Protocol,
		idleTimeout:    l.IdleTimeout.D(),
		requestTimeout: l.RequestTimeout.D(),
	}
	switch l.Protocol {
	case config.ProtocolTCP:
		if l.Cluster == "" && len(l.SNIRoutes) == 0 {
			return nil, fmt.Errorf("protocol %q needs a cluster (or sni_routes)", l.Protocol)
		}
		if l.Cluster != "" && s.clusters[l.Cluster] == nil {
			return nil, fmt.Errorf("cluster %q is not defined (add a [[clusters]] entry named %q)", l.Cluster, l.Cluster)
		}
		if len(l.Routes) > 0 {
			return nil, fmt.Errorf("protocol %q takes no routes (routes are for %q listeners)", l.Protocol, config.ProtocolHTTP)
		}
		ls.cluster = l.Cluster
		if cs := s.cfg.Cluster(l.Cluster); cs != nil {
			ls.tcpHashOn = compileHashOn(cs.HashOn)
		}
		if len(l.SNIRoutes) > 0 {
			if l.TLS != nil {
				return nil, fmt.Errorf("sni_routes pass TLS through and [listeners.tls] terminates it: a listener does one or the other")
			}
			if err := s.compileSNIRoutes(ls, l); err != nil {
				return nil, err
			}
		}
	case config.ProtocolHTTP:
		for j := range l.AccessLog {
			if err := checkAccessLog(&l.AccessLog[j]); err != nil {
				return nil, fmt.Errorf("access_log %d: %w", j, err)
			}
		}
		for j := range l.Routes {
			r, err := s.compileRoute(j, &l.Routes[j], rep)
			if err != nil {
				return nil, fmt.Errorf("route %d: %w", j, err)
			}
			ls.routes = append(ls.routes, r)
		}
	default:
		return nil, fmt.Errorf("protocol %q is not one of %q, %q", l.Protocol, config.ProtocolHTTP, config.ProtocolTCP)
	}
	return ls, nil
}

// compileHostPattern compiles a host or server name as routes write it:
// empty or "*" (any), "name" (exact) or "*.example.com" (any subdomain);
// key names it in an error.
func compileHostPattern(key, value string) (hostPattern, error) {
	host := strings.ToLower(stripPort(strings.TrimSpace(value)))
	switch {
	case host == "" || host == "*":
		return hostPattern{kind: hostAny}, nil
	case strings.HasPrefix(host, "*."):
		if len(host) == 2 || strings.Contains(host[2:], "*") {
			return hostPattern{}, fmt.Errorf("%s %q: a wildcard is written \"*.example.com\"", key, value)
		}
		return hostPattern{kind: hostWildcard, name: host[1:]}, nil
	case strings.Contains(host, "*"):
		return hostPattern{}, fmt.Errorf("%s %q: a wildcard is only allowed as the first label (\"*.example.com\")", key, value)
	}
	return hostPattern{kind: hostExact, name: host}, nil
}

func (s *Snapshot) compileRoute(i int, rs *config.Route, rep *strings.Replacer) (*route, error) {
	r := &route{index: i}
	hp, err := compileHostPattern("host", rs.Host)
	if err != nil {
		return nil, err
	}
	r.hostKin, r.host = hp.kind, hp.name
	if rs.ServerName != "" {
		// A route with server_name matches only TLS connections whose
		// SNI it names (hostPattern.matches: never "").
		if r.serverName, err = compileHostPattern("server_name", rs.ServerName); err != nil {
			return nil, err
		}
		if r.serverName.kind == hostAny {
			return nil, fmt.Errorf("server_name %q: name a host (\"a.example.com\") or a wildcard (\"*.example.com\"), or leave server_name out", rs.ServerName)
		}
	}
	switch {
	case rs.Path != "" && rs.Prefix != "":
		return nil, fmt.Errorf("both path %q and prefix %q are set (choose one)", rs.Path, rs.Prefix)
	case rs.Path != "":
		r.path = rs.Path
	case rs.Prefix != "":
		r.path, r.prefix = rs.Prefix, true
	default:
		return nil, fmt.Errorf("needs a path or a prefix (prefix = \"/\" matches everything)")
	}
	switch {
	case rs.Cluster != "" && rs.DirectResponse != nil:
		return nil, fmt.Errorf("both cluster %q and direct_response are set (choose one)", rs.Cluster)
	case rs.Cluster != "":
		if s.clusters[rs.Cluster] == nil {
			return nil, fmt.Errorf("cluster %q is not defined (add a [[clusters]] entry named %q)", rs.Cluster, rs.Cluster)
		}
		r.cluster = rs.Cluster
		r.connect = rs.Connect
		r.timeout = rs.Timeout.D()
		r.retry = compileRetry(rs)
		if cs := s.cfg.Cluster(rs.Cluster); cs != nil {
			r.hashOn = compileHashOn(cs.HashOn)
			r.http2 = cs.HTTP2
		}
	case rs.DirectResponse != nil:
		d := rs.DirectResponse
		if d.Status < 200 || d.Status > 599 {
			return nil, fmt.Errorf("direct_response: status %d is not a final HTTP status (200 to 599)", d.Status)
		}
		if (d.Status == http.StatusNoContent || d.Status == http.StatusNotModified) && d.Body != "" {
			return nil, fmt.Errorf("direct_response: status %d has no body (remove body)", d.Status)
		}
		ct := d.ContentType
		if ct == "" {
			ct = "text/plain; charset=utf-8"
		}
		body := rep.Replace(d.Body)
		r.direct = &directResponse{
			status:      d.Status,
			body:        []byte(body),
			contentType: []string{ct},
		}
		if d.Status != http.StatusNoContent && d.Status != http.StatusNotModified {
			r.direct.contentLength = []string{strconv.Itoa(len(body))}
		}
	default:
		return nil, fmt.Errorf("needs a cluster or a direct_response")
	}
	return r, nil
}

// compileRetry turns a validated route's retry keys into its policy.
func compileRetry(rs *config.Route) retryPolicy {
	p := retryPolicy{num: rs.NumRetries, perTry: rs.PerTryTimeout.D(), nonIdempotent: rs.RetryNonIdempotent}
	for _, c := range rs.RetryOn {
		switch c {
		case config.RetryConnectFailure:
			p.on |= retryConnectFailure
		case config.RetryReset:
			p.on |= retryReset
		case config.Retry5xx:
			p.on |= retry5xx
		case config.RetryGatewayError:
			p.on |= retryGatewayError
		}
	}
	if p.on == 0 {
		p.num = 0
	}
	return p
}

// compileHashOn turns a validated hash_on into where the key is found.
func compileHashOn(h string) hashSource {
	switch {
	case h == config.HashOnSourceIP:
		return hashSource{kind: hashSourceIP}
	case strings.HasPrefix(h, config.HashOnHeaderPrefix):
		return hashSource{kind: hashHeader, name: strings.ToLower(h[len(config.HashOnHeaderPrefix):])}
	case strings.HasPrefix(h, config.HashOnCookiePrefix):
		return hashSource{kind: hashCookie, name: h[len(config.HashOnCookiePrefix):]}
	}
	return hashSource{}
}
