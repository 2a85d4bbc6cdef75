// Package upstream is where proxied traffic goes: clusters of endpoints,
// the load balancers that choose among them, and each worker's connection
// pools to them.
//
// A Cluster is built once by the main thread from config and is immutable.
// Each worker takes its own view with ForWorker; a view's balancer state and
// keep-alive pool belong to that worker alone, so workers never share
// mutable state (DESIGN §3).
package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// ErrNoEndpoint: the cluster has no endpoint that can take the request.
var ErrNoEndpoint = errors.New("no healthy upstream endpoint")

// ResolveTimeout bounds the lookup of one endpoint's host name in
// NewCluster: a config naming a host whose DNS does not answer must fail
// the build in seconds, not hang the reload.
const ResolveTimeout = 3 * time.Second

// ConnectError is returned when every endpoint tried refused or timed out
// at connect; the request never reached an upstream, so it is safe to say
// 503 to the client.
type ConnectError struct {
	Cluster string
	Tried   []string // endpoint addresses, in the order tried
	Err     error    // the last dial error
}

func (e *ConnectError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster %q: could not connect to any endpoint (tried %s)", e.Cluster, strings.Join(e.Tried, ", "))
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Cluster is a built, immutable cluster.
type Cluster struct {
	Name      string
	Endpoints []Endpoint

	// Settings from the validated spec, as given. A Cluster written as a
	// literal (tests) has them zero: no connect timeout, no pooling.
	policy         string
	connectTimeout time.Duration
	idleTimeout    time.Duration
	maxIdle        int

	// names[i] is endpoint i's host name when it was given as one (its
	// Monitor re-resolves it every dnsRefresh), "" for an IP address.
	names      []string
	dnsRefresh time.Duration

	// hashing is the shared balancer of a ring_hash or maglev cluster.
	hashing *hashing

	// tls[i] is endpoint i's client TLS configuration; nil: plaintext.
	tls []*tls.Config

	// spec is what the cluster was built from: its Monitor reads the
	// health_check and outlier_detection tables.
	spec config.Cluster
	// state is shared with every worker view: the published HostSet,
	// the reported failures, the circuit breakers. nil in a Cluster
	// written as a literal until ForWorker makes one.
	state *clusterState
}

// Endpoint is one resolved upstream address ("ip:port").
type Endpoint struct {
	Address string
}

// resolver is Go's own: no cgo thread blocked in getaddrinfo while the
// main thread builds a config, and the same answers on every machine
// (/etc/hosts, then DNS per resolv.conf).
var resolver = &net.Resolver{PreferGo: true}

// NewCluster builds a cluster from its spec: resolves every endpoint (an
// unresolvable name is an error naming the cluster and the endpoint),
// chooses the balancer.
func NewCluster(spec config.Cluster) (*Cluster, error) {
	c := &Cluster{
		Name:           spec.Name,
		policy:         spec.LBPolicy,
		connectTimeout: spec.ConnectTimeout.D(),
		idleTimeout:    spec.IdleTimeout.D(),
		maxIdle:        orZero(spec.MaxIdlePerEndpoint),
		spec:           spec,
	}
	switch c.policy {
	case "":
		c.policy = config.LBRoundRobin
	case config.LBRoundRobin, config.LBLeastRequest, config.LBRandom:
	case config.LBRingHash, config.LBMaglev:
		// One balancer for every worker: its table depends only on the
		// endpoints as the config names them.
		c.hashing = newHashing(c.policy, spec.Endpoints)
	default:
		return nil, fmt.Errorf("cluster %q: unknown lb_policy %q (valid: %s, %s, %s, %s, %s)",
			spec.Name, spec.LBPolicy, config.LBRoundRobin, config.LBLeastRequest, config.LBRandom, config.LBRingHash, config.LBMaglev)
	}
	// Timeouts and pool sizes are taken as config.Load leaves them:
	// defaults filled in and ranges checked there, and nowhere else.

	if len(spec.Endpoints) == 0 {
		return nil, fmt.Errorf("cluster %q: no endpoints (list at least one \"host:port\" in endpoints)", spec.Name)
	}
	c.Endpoints = make([]Endpoint, 0, len(spec.Endpoints))
	c.names = make([]string, len(spec.Endpoints))
	addrs := make([]string, 0, len(spec.Endpoints))
	for i, ep := range spec.Endpoints {
		addr, err := resolveEndpoint(ep, "")
		if err != nil {
			return nil, fmt.Errorf("cluster %q: endpoint %q: %w", spec.Name, ep, err)
		}
		if host, _, _ := net.SplitHostPort(ep); !isIP(host) {
			c.names[i] = ep
		}
		c.Endpoints = append(c.Endpoints, Endpoint{Address: addr})
		addrs = append(addrs, addr)
	}
	c.dnsRefresh = spec.DNSRefresh.D()
	tlsConfigs, err := clientTLSConfigs(spec)
	if err != nil {
		return nil, err
	}
	c.tls = tlsConfigs
	c.state = newClusterState(addrs, spec)
	c.hashing.prepare(c.state.hosts.Load().usable)
	return c, nil
}

func isIP(host string) bool {
	_, err := netip.ParseAddr(host)
	return err == nil
}

// lookupHost resolves a host name; tests replace it.
var lookupHost = func(ctx context.Context, host string) ([]netip.Addr, error) {
	return resolver.LookupNetIP(ctx, "ip", host)
}

// resolveEndpoint turns "host:port" into "ip:port". Names are resolved when
// the config is built and then by the cluster's Monitor, every dns_refresh,
// on the main side: a worker never waits on DNS. current, when still among
// the answers, is kept, so that a name with several addresses does not
// move its traffic at every refresh.
func resolveEndpoint(ep, current string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", fmt.Errorf("not a \"host:port\" address: %w", err)
	}
	if host == "" {
		return "", errors.New("missing host (write it like \"10.0.0.1:8080\" or \"backend.local:8080\")")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("bad port %q (want a number from 1 to 65535)", port)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return net.JoinHostPort(ip.Unmap().String(), port), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ResolveTimeout)
	defer cancel()
	ips, err := lookupHost(ctx, host)
	if err == nil && len(ips) == 0 {
		err = errors.New("no addresses")
	}
	if err != nil {
		return "", fmt.Errorf("cannot resolve host %q: %w", host, err)
	}
	for _, ip := range ips {
		if a := net.JoinHostPort(ip.Unmap().String(), port); a == current {
			return a, nil
		}
	}
	// IPv4 first: a name with both families most often has a v4 backend
	// listening, and hosts without v6 routes are common.
	pick := ips[0].Unmap()
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			pick = ip.Unmap()
			break
		}
	}
	return net.JoinHostPort(pick.String(), port), nil
}

// ForWorker returns worker w's view of the cluster. Called once per worker
// when a snapshot is built; the view is used only by that worker. Every
// call returns a new view with its own balancer state and pool.
func (c *Cluster) ForWorker(w int) *WorkerCluster {
	if c.state == nil {
		addrs := make([]string, len(c.Endpoints))
		for i, ep := range c.Endpoints {
			addrs[i] = ep.Address
		}
		c.state = newClusterState(addrs, config.Cluster{Name: c.Name})
	}
	s := *c
	wc := &WorkerCluster{
		name:      c.Name,
		n:         len(c.Endpoints),
		timeout:   s.connectTimeout,
		dialer:    net.Dialer{Timeout: s.connectTimeout},
		tls:       s.tls,
		state:     c.state,
		hostStats: make([]hostCounters, len(c.Endpoints)),
	}
	c.state.register(wc)
	wc.bal = newBalancer(s.policy, wc.n, w)
	if c.hashing != nil {
		wc.bal = c.hashing
	}
	wc.idleTimeout = s.idleTimeout
	wc.maxIdle = s.maxIdle
	return wc
}

// WorkerCluster is one worker's view of a cluster: its balancer state, its
// keep-alive pool.
type WorkerCluster struct {
	name    string
	n       int // endpoints; their addresses are in the HostSet
	timeout time.Duration
	dialer  net.Dialer
	tls     []*tls.Config // by endpoint; nil: plaintext
	bal     balancer
	stats   atomic.Pointer[Stats] // nil: not counted
	// state is the cluster's, shared by all workers; hostStats are this
	// worker's counts per endpoint.
	state     *clusterState
	hostStats []hostCounters
	// The keep-alive pool: idleTimeout ages pooled connections out,
	// maxIdle bounds them per endpoint (0: none is kept, every request
	// dials).
	idleTimeout time.Duration
	maxIdle     int
	pool        pool
}

// DialTCP picks an endpoint with the balancer and connects within the
// cluster's connect timeout, trying the next endpoint when one fails. For
// a cluster with [clusters.tls] the connection is TLS, its handshake done
// within the same timeout (a failed one is a failed connect), and it is
// not a *net.TCPConn (no splice: its bytes are encrypted in user space).
// done must be called when the connection is finished with (least_request
// counts active connections with it). Past the circuit breaker's
// max_connections it fails at once with an OverflowError.
func (wc *WorkerCluster) DialTCP(ctx context.Context) (conn net.Conn, endpoint string, done func(), err error) {
	return wc.DialTCPKey(ctx, 0)
}

// DialTCPKey is DialTCP for a connection whose hash_on key is key
// (HashKey of the client's address, for source_ip; 0: none).
func (wc *WorkerCluster) DialTCPKey(ctx context.Context, key uint64) (conn net.Conn, endpoint string, done func(), err error) {
	if wc.n == 0 {
		return nil, "", nil, fmt.Errorf("cluster %q: %w", wc.name, ErrNoEndpoint)
	}
	brk := wc.state.breakers
	if brk != nil && !take(&brk.connections, brk.maxConnections) {
		wc.countOverflow(true)
		return nil, "", nil, brk.errConnections
	}
	hs := wc.hosts()
	usable := hs.usable
	n := len(usable)
	first := wc.bal.pick(usable, key)
	var tried []string
	var last error
	for k := range n {
		i := int(usable[(first+k)%n])
		addr := hs.addrs[i]
		wc.bal.start(i)
		deadline := wc.connectDeadline()
		c, err := wc.dialer.DialContext(ctx, "tcp", addr)
		if err == nil && wc.tls != nil {
			c, err = wc.dialTLS(ctx, c, i, deadline)
		}
		if err == nil || ctx.Err() == nil {
			// A connect abandoned by the caller is not the
			// endpoint's failure.
			c = wc.dialed(c, err, brk)
			wc.reportConnect(i, err == nil)
		}
		if err == nil {
			return c, addr, wc.doneFunc(i), nil
		}
		wc.bal.finish(i)
		tried = append(tried, addr)
		last = err
		if ctx.Err() != nil {
			// The caller gave up (client gone, drain); the other
			// endpoints are not to blame.
			break
		}
	}
	if brk != nil {
		brk.connections.n.Add(-1)
	}
	return nil, "", nil, &ConnectError{Cluster: wc.name, Tried: tried, Err: last}
}

// dialTLS makes nc, DialTCPKey's new connection to endpoint i, a TLS one
// (closing nc when the handshake fails).
func (wc *WorkerCluster) dialTLS(ctx context.Context, nc net.Conn, i int, deadline time.Time) (net.Conn, error) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, errors.New("upstream: dial returned a non-TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		tc.Close()
		return nil, err
	}
	c, _, err := wc.handshake(ctx, tc, raw, i, deadline, wc.stats.Load())
	if err != nil {
		return nil, err
	}
	return c, nil
}

// hosts loads the cluster's current HostSet, whose usable endpoints are
// the ones to choose from (every one in panic mode, counted here).
func (wc *WorkerCluster) hosts() *HostSet {
	hs := wc.state.hosts.Load()
	if hs.panic {
		if st := wc.stats.Load(); st != nil {
			st.LBHealthyPanic.Inc()
		}
	}
	return hs
}

func noop() {}

// doneFunc returns the function that ends the use of endpoint i. Only
// least_request counts; the others share one no-op so a dial allocates
// nothing for it.
func (wc *WorkerCluster) doneFunc(i int) func() {
	if !wc.bal.counts() {
		return noop
	}
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			wc.bal.finish(i)
		}
	}
}

// CloseIdle closes this worker's pooled connections, and those given back
// later: the view is retired (a newer snapshot, or a drain).
func (wc *WorkerCluster) CloseIdle() { wc.closeIdle(true) }

// orZero reads a key whose 0 means something of its own (config declares
// it a pointer, nil when left out); left out here means Cluster was built
// in code without config's SetDefaults: 0, as an int would have been.
func orZero(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
