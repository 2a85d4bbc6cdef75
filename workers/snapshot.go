package workers

import (
	"fmt"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
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

// Snapshot is the compiled form of a config: everything the workers read
// (listener settings, TLS, connection budgets, access logs, steering,
// HTTP/2 server parameters, per-route resolved timeouts and retry policy,
// cluster protocol), built once by BuildSnapshotN from a validated
// config.Config and never changed afterwards. It is the only thing the
// workers receive: no raw config below it, no validation or default after
// it. Connections keep the snapshot they started with.
type Snapshot struct {
	id        Identity
	listeners map[string]*listenerSnap // by listener name
	// order is the listeners' names as the config lists them: the
	// Manager's listener indices.
	order    []string
	clusters map[string]*upstream.Cluster
	// clusterSpecs are what each cluster was built from: a later
	// snapshot built from this one (BuildSnapshotFrom) carries over a
	// cluster whose spec it finds unchanged.
	clusterSpecs map[string]config.Cluster
	// h2Upstreams are how the clusters that speak HTTP/2 are spoken to,
	// by name; a cluster not in it speaks HTTP/1.1.
	h2Upstreams map[string]upstream.H2PoolOptions
	// views[w] is worker w's view of every cluster, by name.
	views []map[string]*upstream.WorkerCluster

	// The process-wide socket settings, fixed when the Manager is built.
	reusePort      bool // one SO_REUSEPORT socket per worker and listener
	maxConnections int  // server.max_connections; 0: from the open-file limit
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

// listenerSnap is one compiled listener, shared by all workers (immutable).
type listenerSnap struct {
	name      string
	protocol  string
	cluster   string     // tcp; "" for a passthrough listener without a default cluster
	tcpHashOn hashSource // tcp: its cluster's hash_on (only source_ip applies)
	routes    []*route
	// targets are every route a request can be given, by route.index:
	// routes, then the routes of the weighted splits' clusters.
	targets     []*route
	idleTimeout time.Duration

	// What the Manager builds the listener's sockets and connections
	// from (fixed when it is built: a socket outlives snapshots).
	address        string
	balance        string // least_conn, hash or kernel
	maxConnections int    // 0: only the server-wide bound
	h1             *h1Settings
	h2             h2ServerParams
	http2Cleartext bool
	// tlsHandshakeTimeout > 0: the listener terminates TLS; its config
	// comes from Options.ServerTLS.
	tlsHandshakeTimeout time.Duration
	accessLogs          []accessLogSpec

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

// route is one compiled route. Exactly one of cluster, split and direct
// is set.
type route struct {
	// index is the route's place in listenerSnap.targets and so in a
	// listenerView's clusters.
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
	// headers must all match too; none: no field is looked at.
	headers []headerMatcher
	// split is a weighted_clusters action: match hands out one of its
	// routes, each a copy of this one for one cluster.
	split *clusterSplit

	// For a cluster: the route's timeout (resolved: its own, or the
	// listener's request_timeout), its retry policy, and what its
	// cluster hashes.
	timeout time.Duration
	retry   exchange.RetryPolicy
	hashOn  hashSource
	http2   bool // its cluster speaks HTTP/2 (clusters.http2)
}

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

// h2ServerParams are an http listener's HTTP/2 server settings.
type h2ServerParams struct {
	maxHeaderBytes int
	idleTimeout    time.Duration
	writeTimeout   time.Duration
}

// accessLogSpec is one access log of a listener, compiled.
type accessLogSpec struct {
	path, format string
	queueSize    int
}

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

// BuildSnapshot compiles cfg for Concurrency(cfg) workers; see
// BuildSnapshotN.
func BuildSnapshot(cfg *config.Config, id Identity) (*Snapshot, error) {
	return BuildSnapshotN(cfg, id, Concurrency(cfg))
}

// BuildSnapshotN is the one door into the data path: it checks cfg with
// config's own rules (Validate: a config built in code is held to what a
// file is), then compiles it for exactly workers workers, building every
// cluster once with upstream.NewCluster and viewing it with ForWorker(w)
// for w in [0, workers). It touches no socket: this is the fail-fast
// build step that serve and validate both run. An error names the key,
// the listener or the cluster at fault.
func BuildSnapshotN(cfg *config.Config, id Identity, workers int) (*Snapshot, error) {
	return BuildSnapshotFrom(cfg, id, workers, nil)
}

// BuildSnapshotFrom is BuildSnapshotN for a configuration that changes in
// process (dynamic configuration, issue 23): a cluster of cfg whose spec is
// the same as in prev is not built again but carried over, the very
// upstream.Cluster and worker views of prev, so that what its endpoints
// have learned survives the change (health, outlier ejections, balancer
// position, keep-alive pools, circuit-breaker counts). A cluster whose
// spec changed is built anew, from nothing, as at start. prev nil (or
// built for fewer workers) carries nothing over.
func BuildSnapshotFrom(cfg *config.Config, id Identity, workers int, prev *Snapshot) (*Snapshot, error) {
	if cfg == nil {
		return nil, fmt.Errorf("workers: nil config")
	}
	if workers < 1 {
		return nil, fmt.Errorf("server: concurrency %d: need at least one worker", workers)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if prev != nil && prev.Workers() < workers {
		prev = nil
	}
	return compileSnapshot(cfg, id, workers, prev)
}

// compileSnapshot compiles a validated cfg: it re-checks nothing that
// Validate checks, and fills in no default.
func compileSnapshot(cfg *config.Config, id Identity, workers int, prev *Snapshot) (*Snapshot, error) {
	s := &Snapshot{
		id:             id,
		listeners:      make(map[string]*listenerSnap, len(cfg.Listeners)),
		clusters:       make(map[string]*upstream.Cluster, len(cfg.Clusters)),
		clusterSpecs:   make(map[string]config.Cluster, len(cfg.Clusters)),
		h2Upstreams:    map[string]upstream.H2PoolOptions{},
		reusePort:      cfg.Server.ReusePortEnabled(),
		maxConnections: cfg.Server.MaxConnections,
	}
	carried := map[string]bool{}
	for _, cs := range cfg.Clusters {
		c := prev.carryCluster(cs)
		if c != nil {
			carried[cs.Name] = true
		} else {
			var err error
			if c, err = upstream.NewCluster(cs); err != nil {
				// upstream's errors already start with `cluster "name":`.
				return nil, err
			}
		}
		s.clusters[cs.Name] = c
		s.clusterSpecs[cs.Name] = cs
		if cs.HTTP2 {
			s.h2Upstreams[cs.Name] = upstream.H2PoolOptions{TLS: cs.TLS != nil, IdleTimeout: cs.IdleTimeout.D()}
		}
	}
	replacer := strings.NewReplacer(
		"%VERSION%", id.Version,
		"%EPOCH%", strconv.Itoa(id.Epoch),
		"%PID%", strconv.Itoa(id.PID),
		"%HOSTNAME%", id.Hostname,
	)
	for i := range cfg.Listeners {
		l := &cfg.Listeners[i]
		ls, err := s.compileListener(cfg, l, replacer)
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", l.Name, err)
		}
		s.listeners[l.Name] = ls
		s.order = append(s.order, l.Name)
	}
	s.views = make([]map[string]*upstream.WorkerCluster, workers)
	for w := range s.views {
		m := make(map[string]*upstream.WorkerCluster, len(s.clusters))
		for name, c := range s.clusters {
			if carried[name] {
				m[name] = prev.views[w][name]
				continue
			}
			m[name] = c.ForWorker(w)
		}
		s.views[w] = m
	}
	return s, nil
}

// carryCluster returns s's cluster named cs.Name if it was built from
// exactly cs, or nil (s nil included).
func (s *Snapshot) carryCluster(cs config.Cluster) *upstream.Cluster {
	if s == nil {
		return nil
	}
	c, ok := s.clusters[cs.Name]
	if !ok || !reflect.DeepEqual(s.clusterSpecs[cs.Name], cs) {
		return nil
	}
	return c
}

// SharesCluster reports whether s and o hold the very same cluster named
// name (carried over by BuildSnapshotFrom): the main side keeps its
// health monitor running rather than starting one anew.
func (s *Snapshot) SharesCluster(o *Snapshot, name string) bool {
	if s == nil || o == nil {
		return false
	}
	c, ok := s.clusters[name]
	return ok && o.clusters[name] == c
}

func (s *Snapshot) compileListener(cfg *config.Config, l *config.Listener, rep *strings.Replacer) (*listenerSnap, error) {
	ls := &listenerSnap{
		name:           l.Name,
		protocol:       l.Protocol,
		idleTimeout:    l.IdleTimeout.D(),
		address:        l.Address,
		balance:        l.Balance,
		maxConnections: l.MaxConnections,
		http2Cleartext: l.HTTP2Cleartext,
	}
	if l.TLS != nil {
		ls.tlsHandshakeTimeout = l.TLS.HandshakeTimeout.D()
	}
	switch l.Protocol {
	case config.ProtocolTCP:
		ls.cluster = l.Cluster
		if cs := cfg.Cluster(l.Cluster); cs != nil {
			ls.tcpHashOn = compileHashOn(cs.HashOn)
		}
		if len(l.SNIRoutes) > 0 {
			if err := s.compileSNIRoutes(cfg, ls, l); err != nil {
				return nil, err
			}
		}
	case config.ProtocolHTTP:
		ls.h1 = &h1Settings{
			limits:        http1.Limits{MaxHeadBytes: l.MaxHeaderBytes},
			headerTimeout: l.HeaderTimeout.D(),
			idleTimeout:   l.IdleTimeout.D(),
			writeTimeout:  l.WriteTimeout.D(),
			trustXFF:      l.TrustsForwardedFor(),
			parkIdle:      l.ParkIdleConnections && parkedSocketsSupported,
		}
		ls.h2 = h2ServerParams{maxHeaderBytes: l.MaxHeaderBytes, idleTimeout: l.IdleTimeout.D(), writeTimeout: l.WriteTimeout.D()}
		for j := range l.AccessLog {
			a := &l.AccessLog[j]
			if err := checkAccessLog(a.Path); err != nil {
				return nil, fmt.Errorf("access_log %d: %w", j, err)
			}
			ls.accessLogs = append(ls.accessLogs, accessLogSpec{path: a.Path, format: a.Format, queueSize: a.QueueSize})
		}
		for j := range l.Routes {
			r, err := compileRoute(cfg, j, l, &l.Routes[j], rep)
			if err != nil {
				return nil, fmt.Errorf("route %d: %w", j, err)
			}
			ls.routes = append(ls.routes, r)
		}
		ls.targets = append(ls.targets, ls.routes...)
		for _, r := range ls.routes {
			if r.split == nil {
				continue
			}
			for _, t := range r.split.routes {
				t.index = len(ls.targets)
				ls.targets = append(ls.targets, t)
			}
		}
	}
	return ls, nil
}

func (s *Snapshot) compileSNIRoutes(cfg *config.Config, ls *listenerSnap, l *config.Listener) error {
	for j, sr := range l.SNIRoutes {
		r := sniRoute{cluster: sr.Cluster}
		for n, name := range sr.ServerNames {
			p, err := compileHostPattern(fmt.Sprintf("sni_routes[%d].server_names[%d]", j, n), name)
			if err != nil {
				return err
			}
			r.serverNames = append(r.serverNames, p)
		}
		if cs := cfg.Cluster(sr.Cluster); cs != nil {
			r.hashOn = compileHashOn(cs.HashOn)
		}
		ls.sniRoutes = append(ls.sniRoutes, r)
	}
	// The ClientHello comes right after the connect; the listener's
	// idle_timeout, when shorter, bounds the wait too.
	ls.helloTimeout = config.DefaultHandshakeTimeout
	if d := l.IdleTimeout.D(); d > 0 && d < ls.helloTimeout {
		ls.helloTimeout = d
	}
	return nil
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

func compileRoute(cfg *config.Config, i int, l *config.Listener, rs *config.Route, rep *strings.Replacer) (*route, error) {
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
	}
	if rs.Path != "" {
		r.path = rs.Path
	} else {
		r.path, r.prefix = rs.Prefix, true
	}
	for _, h := range rs.Headers {
		r.headers = append(r.headers, compileHeaderMatch(h))
	}
	if rs.ProxiesToCluster() {
		r.connect = rs.Connect
		r.timeout = rs.Timeout.D()
		if r.timeout == 0 {
			r.timeout = l.RequestTimeout.D()
		}
		r.retry = compileRetry(rs)
	}
	switch {
	case rs.Cluster != "":
		if err := r.setCluster(cfg, rs.Cluster); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		return r, nil
	case len(rs.WeightedClusters) > 0:
		split := &clusterSplit{}
		for k, w := range rs.WeightedClusters {
			// A copy of the route, but for its cluster; its index is
			// given by compileListener. Retries stay on that cluster.
			t := *r
			t.headers = nil
			if err := t.setCluster(cfg, w.Cluster); err != nil {
				return nil, fmt.Errorf("weighted_clusters[%d].cluster: %w", k, err)
			}
			split.total += uint64(w.Weight)
			split.upTo = append(split.upTo, split.total)
			split.routes = append(split.routes, &t)
		}
		r.split = split
		return r, nil
	}
	d := rs.DirectResponse
	body := rep.Replace(d.Body)
	r.direct = &directResponse{
		status:      d.Status,
		body:        []byte(body),
		contentType: []string{d.ContentType},
	}
	if d.Status != http.StatusNoContent && d.Status != http.StatusNotModified {
		r.direct.contentLength = []string{strconv.Itoa(len(body))}
	}
	return r, nil
}

// setCluster makes name the route's cluster, with what the data path
// needs of it.
func (r *route) setCluster(cfg *config.Config, name string) error {
	cs := cfg.Cluster(name)
	if cs == nil {
		return fmt.Errorf("%q: no such cluster in the configuration", name)
	}
	r.cluster = name
	r.hashOn = compileHashOn(cs.HashOn)
	r.http2 = cs.HTTP2
	return nil
}

// compileHeaderMatch turns a validated header match into its matcher.
func compileHeaderMatch(h config.HeaderMatch) headerMatcher {
	m := headerMatcher{name: strings.ToLower(h.Name), ignoreCase: h.IgnoreCase, invert: h.Invert}
	switch {
	case h.Present:
		m.kind = headerPresent
	case h.Exact != nil:
		m.kind, m.value = headerExact, *h.Exact
	default:
		m.kind, m.value = headerPrefix, h.Prefix
	}
	return m
}

// compileRetry turns a validated route's retry keys into its policy.
func compileRetry(rs *config.Route) exchange.RetryPolicy {
	p := exchange.RetryPolicy{PerTry: rs.PerTryTimeout.D(), NonIdempotent: rs.RetryNonIdempotent}
	for _, c := range rs.RetryOn {
		switch c {
		case config.RetryConnectFailure:
			p.On |= exchange.RetryConnectFailure
		case config.RetryReset:
			p.On |= exchange.RetryReset
		case config.Retry5xx:
			p.On |= exchange.Retry5xx
		case config.RetryGatewayError:
			p.On |= exchange.RetryGatewayError
		}
	}
	if rs.NumRetries != nil && p.On != 0 {
		p.Num = *rs.NumRetries
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
