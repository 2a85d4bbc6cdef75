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
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
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
	cluster   string           // tcp; "" for a passthrough listener without a default cluster
	tcpHashOn route.HashSource // tcp: its cluster's hash_on (only source_ip applies)
	routes    route.Table
	// targets are every route a request can be given, by Route.Index:
	// routes, then the routes of the weighted splits' clusters.
	targets     []*route.Route
	idleTimeout time.Duration

	// What the Manager builds the listener's sockets and connections
	// from (fixed when it is built: a socket outlives snapshots).
	address        string
	balance        string // least_conn, hash or kernel
	maxConnections int    // 0: only the server-wide bound
	h1             *httpfront.Settings
	h2             httpfront.H2Params
	http2Cleartext bool
	// tlsHandshakeTimeout > 0: the listener terminates TLS; its config
	// comes from Options.ServerTLS.
	tlsHandshakeTimeout time.Duration
	accessLogs          []accessLogSpec

	// TLS passthrough (tcp, sni_routes; downstream/tcp): the routes, and how long
	// a client may take to send its ClientHello.
	sniRoutes    route.SNITable
	helloTimeout time.Duration

	// fixed is the listener's configuration but what a snapshot carries
	// (routes, a tcp listener's cluster): what its sockets, settings,
	// TLS and access logs were built from. UpdateListeners keeps a
	// listener whose fixed part is unchanged as it is (sameFixed).
	fixed config.Listener
}

// fixedPart is l without what a snapshot carries: routes and a tcp
// listener's cluster.
func fixedPart(l *config.Listener) config.Listener {
	f := *l
	f.Routes, f.Cluster = nil, ""
	return f
}

// sameFixed reports whether a and b are the same listener in everything
// its sockets and connections are built from (fixedPart).
func sameFixed(a, b *listenerSnap) bool {
	return a.name == b.name && reflect.DeepEqual(a.fixed, b.fixed)
}

// accessLogSpec is one access log of a listener, compiled.
type accessLogSpec struct {
	path, format string
	queueSize    int
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
		fixed:          fixedPart(l),
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
		ls.h1 = &httpfront.Settings{
			Limits:        http1.Limits{MaxHeadBytes: l.MaxHeaderBytes},
			HeaderTimeout: l.HeaderTimeout.D(),
			IdleTimeout:   l.IdleTimeout.D(),
			WriteTimeout:  l.WriteTimeout.D(),
			TrustXFF:      l.TrustsForwardedFor(),
			ParkIdle:      l.ParksIdleConnections() && httpfront.ParkedSocketsSupported,
		}
		ls.h2 = httpfront.H2Params{MaxHeaderBytes: l.MaxHeaderBytes, IdleTimeout: l.IdleTimeout.D(), WriteTimeout: l.WriteTimeout.D()}
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
			if r.Split == nil {
				continue
			}
			for _, t := range r.Split.Routes {
				t.Index = len(ls.targets)
				ls.targets = append(ls.targets, t)
			}
		}
	}
	return ls, nil
}

func (s *Snapshot) compileSNIRoutes(cfg *config.Config, ls *listenerSnap, l *config.Listener) error {
	for j, sr := range l.SNIRoutes {
		r := route.SNIRoute{Cluster: sr.Cluster}
		for n, name := range sr.ServerNames {
			p, err := route.CompileHostPattern(fmt.Sprintf("sni_routes[%d].server_names[%d]", j, n), name)
			if err != nil {
				return err
			}
			r.ServerNames = append(r.ServerNames, p)
		}
		if cs := cfg.Cluster(sr.Cluster); cs != nil {
			r.HashOn = compileHashOn(cs.HashOn)
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

func compileRoute(cfg *config.Config, i int, l *config.Listener, rs *config.Route, rep *strings.Replacer) (*route.Route, error) {
	r := &route.Route{Index: i}
	hp, err := route.CompileHostPattern("host", rs.Host)
	if err != nil {
		return nil, err
	}
	r.HostKind, r.Host = hp.Kind, hp.Name
	if rs.ServerName != "" {
		// A route with server_name matches only TLS connections whose
		// SNI it names (hostPattern.matches: never "").
		if r.ServerName, err = route.CompileHostPattern("server_name", rs.ServerName); err != nil {
			return nil, err
		}
	}
	if rs.Path != "" {
		r.Path = rs.Path
	} else {
		r.Path, r.Prefix = rs.Prefix, true
	}
	for _, h := range rs.Headers {
		r.Headers = append(r.Headers, compileHeaderMatch(h))
	}
	if rs.ProxiesToCluster() {
		r.Connect = rs.Connect
		r.Timeout = rs.Timeout.D()
		if r.Timeout == 0 {
			r.Timeout = l.RequestTimeout.D()
		}
		r.Retry = compileRetry(rs)
	}
	switch {
	case rs.Cluster != "":
		if err := setCluster(r, cfg, rs.Cluster); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		return r, nil
	case len(rs.WeightedClusters) > 0:
		split := &route.ClusterSplit{}
		for k, w := range rs.WeightedClusters {
			// A copy of the route, but for its cluster; its index is
			// given by compileListener. Retries stay on that cluster.
			t := *r
			t.Headers = nil
			if err := setCluster(&t, cfg, w.Cluster); err != nil {
				return nil, fmt.Errorf("weighted_clusters[%d].cluster: %w", k, err)
			}
			split.Total += uint64(w.Weight)
			split.UpTo = append(split.UpTo, split.Total)
			split.Routes = append(split.Routes, &t)
		}
		r.Split = split
		return r, nil
	}
	d := rs.DirectResponse
	body := rep.Replace(d.Body)
	r.Direct = &route.DirectResponse{
		Status:      d.Status,
		Body:        []byte(body),
		ContentType: []string{d.ContentType},
	}
	if d.Status != http.StatusNoContent && d.Status != http.StatusNotModified {
		r.Direct.ContentLength = []string{strconv.Itoa(len(body))}
	}
	return r, nil
}

// setCluster makes name the route's cluster, with what the data path
// needs of it.
func setCluster(r *route.Route, cfg *config.Config, name string) error {
	cs := cfg.Cluster(name)
	if cs == nil {
		return fmt.Errorf("%q: no such cluster in the configuration", name)
	}
	r.Cluster = name
	r.HashOn = compileHashOn(cs.HashOn)
	r.HTTP2 = cs.HTTP2
	return nil
}

// compileHeaderMatch turns a validated header match into its matcher.
func compileHeaderMatch(h config.HeaderMatch) route.HeaderMatcher {
	m := route.HeaderMatcher{Name: strings.ToLower(h.Name), IgnoreCase: h.IgnoreCase, Invert: h.Invert}
	switch {
	case h.Present:
		m.Kind = route.HeaderPresent
	case h.Exact != nil:
		m.Kind, m.Value = route.HeaderExact, *h.Exact
	default:
		m.Kind, m.Value = route.HeaderPrefix, h.Prefix
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
func compileHashOn(h string) route.HashSource {
	switch {
	case h == config.HashOnSourceIP:
		return route.HashSource{Kind: route.HashSourceIP}
	case strings.HasPrefix(h, config.HashOnHeaderPrefix):
		return route.HashSource{Kind: route.HashHeader, Name: strings.ToLower(h[len(config.HashOnHeaderPrefix):])}
	case strings.HasPrefix(h, config.HashOnCookiePrefix):
		return route.HashSource{Kind: route.HashCookie, Name: h[len(config.HashOnCookiePrefix):]}
	}
	return route.HashSource{}
}
