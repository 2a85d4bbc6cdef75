package xds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

const testNode = "proxy-1"

// seenRequest is a request as the control plane received it, SotW or delta.
type seenRequest struct {
	typeURL   TypeURL
	version   string // SotW version_info
	nonce     string
	errorMsg  string
	names     []string          // SotW resource_names, or delta's subscribe
	initial   map[string]string // delta initial_resource_versions
	streamID  int64
	delta     bool
	arrivedAt time.Time
}

// controlPlane is go-control-plane's snapshot cache and server on a
// loopback port, recording every request through its callbacks.
type controlPlane struct {
	tb    testing.TB
	cache cachev3.SnapshotCache
	addr  string
	gs    *grpc.Server

	mu       sync.Mutex // guards requests, pushedAt
	requests []seenRequest
	// pushed is when the server sent the first response of each
	// type and version.
	pushed map[string]time.Time
	notify chan struct{}
}

func (cp *controlPlane) pushedAt(t TypeURL, version string) time.Time {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.pushed[string(t)+"@"+version]
}

func (cp *controlPlane) recordPush(t, version string) {
	now := time.Now()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.pushed == nil {
		cp.pushed = map[string]time.Time{}
	}
	if _, ok := cp.pushed[t+"@"+version]; !ok {
		cp.pushed[t+"@"+version] = now
	}
}

func startControlPlane(tb testing.TB, addr string) *controlPlane {
	tb.Helper()
	cp := &controlPlane{tb: tb, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), notify: make(chan struct{}, 1)}
	cp.serve(addr)
	return cp
}

func (cp *controlPlane) serve(addr string) {
	cp.tb.Helper()
	var lis net.Listener
	var err error
	// A restarted control plane takes the port it had; the kernel may
	// hold it for a moment after the close.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		cp.tb.Fatalf("control plane: listen %s: %v", addr, err)
	}
	cp.addr = lis.Addr().String()
	record := func(r seenRequest) {
		r.arrivedAt = time.Now()
		cp.mu.Lock()
		cp.requests = append(cp.requests, r)
		cp.mu.Unlock()
		select {
		case cp.notify <- struct{}{}:
		default:
		}
	}
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			record(seenRequest{typeURL: TypeURL(req.GetTypeUrl()), version: req.GetVersionInfo(), nonce: req.GetResponseNonce(),
				errorMsg: req.GetErrorDetail().GetMessage(), names: req.GetResourceNames(), streamID: id})
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			cp.recordPush(resp.GetTypeUrl(), resp.GetVersionInfo())
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			cp.recordPush(resp.GetTypeUrl(), resp.GetSystemVersionInfo())
		},
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			record(seenRequest{typeURL: TypeURL(req.GetTypeUrl()), nonce: req.GetResponseNonce(), errorMsg: req.GetErrorDetail().GetMessage(),
				names: req.GetResourceNamesSubscribe(), initial: req.GetInitialResourceVersions(), streamID: id, delta: true})
			return nil
		},
	}
	cp.gs = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.gs, serverv3.NewServer(context.Background(), cp.cache, cb))
	go cp.gs.Serve(lis)
	gs := cp.gs
	cp.tb.Cleanup(gs.Stop)
}

func (cp *controlPlane) stop() { cp.gs.Stop() }

func (cp *controlPlane) set(version string, res map[resourcev3.Type][]types.Resource) {
	cp.tb.Helper()
	snap, err := cachev3.NewSnapshot(version, res)
	if err != nil {
		cp.tb.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), testNode, snap); err != nil {
		cp.tb.Fatal(err)
	}
}

// waitRequest waits for a request that match accepts, among those after
// the first `from`; it returns the request and its index.
func (cp *controlPlane) waitRequest(from int, what string, match func(seenRequest) bool) (seenRequest, int) {
	cp.tb.Helper()
	deadline := time.After(10 * time.Second)
	for {
		cp.mu.Lock()
		for i := from; i < len(cp.requests); i++ {
			if match(cp.requests[i]) {
				r := cp.requests[i]
				cp.mu.Unlock()
				return r, i
			}
		}
		cp.mu.Unlock()
		select {
		case <-cp.notify:
		case <-deadline:
			cp.mu.Lock()
			defer cp.mu.Unlock()
			cp.tb.Fatalf("control plane: no request %s within 10s; requests: %+v", what, cp.requests)
		}
	}
}

func (cp *controlPlane) count() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return len(cp.requests)
}

// resources builds the fixture: listener "web" on listenPort routing
// everything by RDS "local_route" to EDS cluster "backend" at endpoint.
func resources(tb testing.TB, endpoint string, mutate ...func(*clusterv3.Cluster)) map[resourcev3.Type][]types.Resource {
	tb.Helper()
	ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3}
	cl := &clusterv3.Cluster{
		Name:                 "backend",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads},
		ConnectTimeout:       durationpb.New(2 * time.Second),
	}
	for _, m := range mutate {
		m(cl)
	}
	host, port := splitHostPort(tb, endpoint)
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "backend", Endpoints: []*endpointv3.LocalityLbEndpoints{{
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: sockAddr(host, port)}}}},
	}}}
	rc := &routev3.RouteConfiguration{Name: "local_route", VirtualHosts: []*routev3.VirtualHost{{
		Name: "all", Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "backend"}}},
		}},
	}}}
	router, _ := anypb.New(&routerv3.Router{})
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix:     "web",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: ads, RouteConfigName: "local_route"}},
		HttpFilters:    []*hcmv3.HttpFilter{{Name: routerName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	lis := &listenerv3.Listener{
		Name:    "web",
		Address: sockAddr("127.0.0.1", 10080),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
	return map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  {cl},
		resourcev3.EndpointType: {cla},
		resourcev3.RouteType:    {rc},
		resourcev3.ListenerType: {lis},
	}
}

func sockAddr(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

func splitHostPort(tb testing.TB, hp string) (string, uint32) {
	tb.Helper()
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		tb.Fatal(err)
	}
	var n uint32
	fmt.Sscan(p, &n)
	return h, n
}

type events struct {
	mu        sync.Mutex
	connected []bool
	rejected  []string
}

func startClient(tb testing.TB, cp *controlPlane, p Protocol, mod func(*Config)) (*Client, *events) {
	tb.Helper()
	ev := &events{}
	cfg := Config{
		Dial:                DialTarget(cp.addr, nil),
		NodeID:              testNode,
		NodeCluster:         "test",
		Protocol:            p,
		InitialFetchTimeout: 5 * time.Second,
		BackoffBase:         20 * time.Millisecond,
		BackoffMax:          200 * time.Millisecond,
		SecretDir:           tb.TempDir() + "/secrets",
		Events: Events{
			Connected: func(up bool) { ev.mu.Lock(); ev.connected = append(ev.connected, up); ev.mu.Unlock() },
			UpdateRejected: func(t TypeURL, err error) {
				ev.mu.Lock()
				ev.rejected = append(ev.rejected, err.Error())
				ev.mu.Unlock()
			},
		},
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: testWriter{tb}, Level: hclog.Debug})
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				tb.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			tb.Error("Run did not return within 10s of its context's end")
		}
	})
	return c, ev
}

// testWriter sends the client's log to the test's, shown on failure.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func nextUpdate(tb testing.TB, c *Client, within time.Duration) *Update {
	tb.Helper()
	select {
	case u := <-c.Updates():
		return u
	case <-time.After(within):
		tb.Fatalf("no Update within %s", within)
	}
	return nil
}

func endpointsOf(st *State, cluster string) []string {
	for _, c := range st.Clusters {
		if c.Name == cluster {
			return c.Endpoints
		}
	}
	return nil
}

func bothProtocols(t *testing.T, f func(t *testing.T, p Protocol)) {
	for _, p := range []Protocol{ProtocolSotW, ProtocolDelta} {
		t.Run(string(p), func(t *testing.T) { f(t, p) })
	}
}

// isACK: a request answering a response (it has a nonce) without an error.
func isACK(t TypeURL) func(seenRequest) bool {
	return func(r seenRequest) bool { return r.typeURL == t && r.nonce != "" && r.errorMsg == "" }
}

func TestFirstUpdateIsTheMappedState(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, _ := startClient(t, cp, p, nil)
		u := nextUpdate(t, c, 10*time.Second)
		st := u.State
		if len(st.Listeners) != 1 || len(st.Clusters) != 1 {
			t.Fatalf("state: %d listeners, %d clusters; want 1 and 1: %+v", len(st.Listeners), len(st.Clusters), st)
		}
		l := st.Listeners[0]
		if l.Name != "web" || l.Address != "127.0.0.1:10080" || l.Protocol != "http" {
			t.Errorf("listener: %+v", l)
		}
		if len(l.Routes) != 1 || l.Routes[0].Cluster != "backend" || l.Routes[0].Prefix != "/" {
			t.Errorf("routes (from RDS): %+v", l.Routes)
		}
		if l.RequestTimeout.D() != 60*time.Second {
			t.Errorf("request_timeout %v: the TOML default (60s) was not filled in", l.RequestTimeout.D())
		}
		cl := st.Clusters[0]
		if cl.Name != "backend" || !slices.Equal(cl.Endpoints, []string{"127.0.0.1:9001"}) || cl.ConnectTimeout.D() != 2*time.Second {
			t.Errorf("cluster (endpoints from EDS): %+v", cl)
		}
		for _, typ := range []TypeURL{ListenerType, RouteType, ClusterType, EndpointType} {
			if st.Versions[typ] != "1" {
				t.Errorf("version of %s: %q, want 1", typ.Short(), st.Versions[typ])
			}
			if len(st.Raw[typ]) != 1 {
				t.Errorf("raw %s: %d resources, want 1", typ.Short(), len(st.Raw[typ]))
			}
		}
		if p == ProtocolDelta && st.ResourceVersions[ClusterType]["backend"] == "" {
			t.Errorf("delta: no per-resource version for cluster backend: %v", st.ResourceVersions)
		}
		from := cp.count()
		doneAt := time.Now()
		u.Done(nil)
		for _, typ := range []TypeURL{ListenerType, RouteType, ClusterType, EndpointType} {
			// SotW: the ACK carries the version applied; delta: the
			// nonce, after the Update was handed over.
			r, _ := cp.waitRequest(from, "ACK of "+typ.Short(), func(r seenRequest) bool {
				return isACK(typ)(r) && (p == ProtocolDelta || r.version == "1")
			})
			if r.arrivedAt.Before(doneAt) {
				t.Errorf("ACK of %s before Done", typ.Short())
			}
		}
	})
}

// measureEndpointChanges pushes n endpoint changes and returns, sorted,
// the time from each push of the endpoints (the server's response
// callback) to the Update in the main goroutine's hands; it fails tb if a
// change is lost or arrives with the wrong endpoints.
func measureEndpointChanges(tb testing.TB, p Protocol, n int) []time.Duration {
	cp := startControlPlane(tb, "127.0.0.1:0")
	cp.set("0", resources(tb, "127.0.0.1:9000"))
	c, _ := startClient(tb, cp, p, nil)
	nextUpdate(tb, c, 10*time.Second).Done(nil)
	lat := make([]time.Duration, 0, n)
	for i := 1; i <= n; i++ {
		ep := fmt.Sprintf("127.0.0.1:%d", 9000+i)
		cp.set(fmt.Sprint(i), resources(tb, ep))
		u := nextUpdate(tb, c, 5*time.Second)
		got := time.Now()
		pushed := cp.pushedAt(EndpointType, fmt.Sprint(i))
		if pushed.IsZero() {
			tb.Fatalf("update %d: the server never pushed eds version %d", i, i)
		}
		lat = append(lat, got.Sub(pushed))
		if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{ep}) {
			tb.Fatalf("update %d: endpoints %v, want [%s]", i, got, ep)
		}
		u.Done(nil)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat
}

// Every one of 100 endpoint changes reaches an Update, in order. How fast
// is a measurement, not an assertion here (a loaded CI machine under
// -race once took 315ms at p99): BenchmarkEndpointChangeToUpdate reports
// it against issue 23's bar of 100ms.
func TestEndpointChangesEachReachAnUpdate(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		const n = 100
		lat := measureEndpointChanges(t, p, n)
		t.Logf("%s: endpoint change to Update over %d pushes: p50 %v, p99 %v, max %v (the bar, measured by BenchmarkEndpointChangeToUpdate: p99 100ms)",
			p, n, lat[n/2], lat[n*99/100-1], lat[n-1])
	})
}

// BenchmarkEndpointChangeToUpdate reports p50 and p99 of push → Update
// over 100 changes per iteration (issue 23: p99 within 100ms):
// go test -run '^$' -bench EndpointChangeToUpdate ./xds/
func BenchmarkEndpointChangeToUpdate(b *testing.B) {
	for _, p := range []Protocol{ProtocolSotW, ProtocolDelta} {
		b.Run(string(p), func(b *testing.B) {
			const n = 100
			var all []time.Duration
			for range b.N {
				all = append(all, measureEndpointChanges(b, p, n)...)
			}
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			b.ReportMetric(float64(all[len(all)/2])/float64(time.Millisecond), "p50-ms")
			b.ReportMetric(float64(all[len(all)*99/100-1])/float64(time.Millisecond), "p99-ms")
			if p99 := all[len(all)*99/100-1]; p99 > 100*time.Millisecond {
				b.Logf("over the bar: p99 %v > 100ms", p99)
			}
		})
	}
}

func TestDoneWithAnErrorNACKsAndKeepsThePreviousState(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, ev := startClient(t, cp, p, nil)
		nextUpdate(t, c, 10*time.Second).Done(nil)
		cp.waitRequest(0, "ACK of eds v1", isACK(EndpointType))

		cp.set("2", resources(t, "127.0.0.1:9002"))
		u := nextUpdate(t, c, 10*time.Second)
		if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9002"}) {
			t.Fatalf("v2 endpoints %v", got)
		}
		const why = `clusters[0] (backend).endpoints[0]: "127.0.0.1:9002": refused by the test`
		u.Done(errors.New(why))
		nack, _ := cp.waitRequest(0, "NACK of eds", func(r seenRequest) bool { return r.typeURL == EndpointType && r.errorMsg != "" })
		if nack.errorMsg != why {
			t.Errorf("NACK error_detail %q, want %q", nack.errorMsg, why)
		}
		if p == ProtocolSotW && nack.version != "1" {
			t.Errorf("NACK version_info %q, want the last accepted, 1", nack.version)
		}
		ev.mu.Lock()
		if len(ev.rejected) == 0 || ev.rejected[0] != why {
			t.Errorf("UpdateRejected events %q", ev.rejected)
		}
		ev.mu.Unlock()

		// The next change is applied on the kept state (v1's listener
		// and routes), and carries the new endpoints.
		cp.set("3", resources(t, "127.0.0.1:9003"))
		u = nextUpdate(t, c, 10*time.Second)
		if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9003"}) {
			t.Fatalf("v3 endpoints %v", got)
		}
		if len(u.State.Listeners) != 1 || len(u.State.Listeners[0].Routes) != 1 {
			t.Fatalf("v3 state lost the listener or its routes: %+v", u.State.Listeners)
		}
		u.Done(nil)
	})
}

func TestUnsupportedFieldIsNACKedWithItsName(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, _ := startClient(t, cp, p, nil)
		nextUpdate(t, c, 10*time.Second).Done(nil)

		cp.set("2", resources(t, "127.0.0.1:9001", func(cl *clusterv3.Cluster) {
			cl.LbSubsetConfig = &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT}
		}))
		nack, _ := cp.waitRequest(0, "NACK of cds", func(r seenRequest) bool { return r.typeURL == ClusterType && r.errorMsg != "" })
		const want = `cluster "backend": field "lb_subset_config" is not supported by hotproxy`
		if nack.errorMsg != want {
			t.Errorf("NACK error_detail %q, want %q", nack.errorMsg, want)
		}
		// No Update for the refused cluster: the next one is v3's.
		cp.set("3", resources(t, "127.0.0.1:9003"))
		u := nextUpdate(t, c, 10*time.Second)
		if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9003"}) {
			t.Fatalf("the Update after the NACK has endpoints %v, want v3's", got)
		}
		if v := u.State.Versions[ClusterType]; v != "1" && v != "3" {
			t.Errorf("cds version %q: the refused version 2 was applied", v)
		}
		u.Done(nil)
	})
}

func TestControlPlaneRestartResumesWithTheLastVersions(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, ev := startClient(t, cp, p, nil)
		first := nextUpdate(t, c, 10*time.Second)
		first.Done(nil)
		cp.waitRequest(0, "ACK of lds", isACK(ListenerType))

		addr := cp.addr
		cp.stop()
		before := cp.count()
		cp2 := &controlPlane{tb: t, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), notify: make(chan struct{}, 1)}
		cp2.set("1", resources(t, "127.0.0.1:9001"))
		cp2.serve(addr)
		_ = before

		// The new stream's first requests say what the client holds.
		for _, typ := range []TypeURL{ClusterType, EndpointType, ListenerType, RouteType} {
			r, _ := cp2.waitRequest(0, "first request of "+typ.Short(), func(r seenRequest) bool { return r.typeURL == typ })
			switch p {
			case ProtocolSotW:
				if r.version != "1" {
					t.Errorf("resumed %s request: version_info %q, want 1", typ.Short(), r.version)
				}
			case ProtocolDelta:
				want := first.State.ResourceVersions[typ]
				if len(r.initial) == 0 || fmt.Sprint(r.initial) != fmt.Sprint(want) {
					t.Errorf("resumed %s request: initial_resource_versions %v, want %v", typ.Short(), r.initial, want)
				}
			}
		}
		// Same resources: nothing to apply; a change still arrives.
		cp2.set("2", resources(t, "127.0.0.1:9002"))
		u := nextUpdate(t, c, 10*time.Second)
		if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9002"}) {
			t.Fatalf("after the restart: endpoints %v, want v2's", got)
		}
		if len(u.State.Listeners) != 1 || len(u.State.Listeners[0].Routes) != 1 {
			t.Fatalf("after the restart the listener or its routes are lost: %+v", u.State.Listeners)
		}
		u.Done(nil)
		ev.mu.Lock()
		defer ev.mu.Unlock()
		if !slices.Contains(ev.connected, false) || ev.connected[len(ev.connected)-1] != true {
			t.Errorf("Connected events %v: want a false then true", ev.connected)
		}
	})
}

func TestInitialFetchTimeout(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		t.Run("endpoints never sent", func(t *testing.T) {
			cp := startControlPlane(t, "127.0.0.1:0")
			res := resources(t, "127.0.0.1:9001")
			delete(res, resourcev3.EndpointType) // the CP never answers EDS "backend"
			cp.set("1", res)
			const timeout = 400 * time.Millisecond
			start := time.Now()
			c, _ := startClient(t, cp, p, func(cfg *Config) { cfg.InitialFetchTimeout = timeout })
			u := nextUpdate(t, c, 10*time.Second)
			if el := time.Since(start); el < timeout {
				t.Errorf("Update after %v, before initial_fetch_timeout (%v): the cluster was not warm", el, timeout)
			}
			if len(u.State.Clusters) != 1 || len(u.State.Clusters[0].Endpoints) != 0 {
				t.Errorf("clusters %+v: want backend without endpoints", u.State.Clusters)
			}
			u.Done(nil)
		})
		t.Run("no snapshot at all", func(t *testing.T) {
			cp := startControlPlane(t, "127.0.0.1:0")
			const timeout = 300 * time.Millisecond
			start := time.Now()
			c, _ := startClient(t, cp, p, func(cfg *Config) { cfg.InitialFetchTimeout = timeout })
			u := nextUpdate(t, c, 10*time.Second)
			if el := time.Since(start); el < timeout {
				t.Errorf("Update after %v, before initial_fetch_timeout (%v)", el, timeout)
			}
			if len(u.State.Clusters)+len(u.State.Listeners) != 0 {
				t.Errorf("state %+v, want empty", u.State)
			}
			u.Done(nil)
			// The answer, when it comes, is applied.
			cp.set("1", resources(t, "127.0.0.1:9001"))
			u = nextUpdate(t, c, 10*time.Second)
			if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9001"}) {
				t.Fatalf("late answer: endpoints %v", got)
			}
			u.Done(nil)
		})
	})
}

func TestHandedOverStateIsServedFirstAndResumed(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("7", resources(t, "127.0.0.1:9007"))
		c, _ := startClient(t, cp, p, nil)
		u := nextUpdate(t, c, 10*time.Second)
		u.Done(nil)
		handed := u.State

		// The next generation, while the control plane is down.
		addr := cp.addr
		cp.stop()
		c2, _ := startClient(t, &controlPlane{addr: addr}, p, func(cfg *Config) { cfg.Initial = handed })
		u2 := nextUpdate(t, c2, 10*time.Second)
		if got := endpointsOf(u2.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9007"}) {
			t.Fatalf("handed-over state: endpoints %v", got)
		}
		if len(u2.State.Listeners) != 1 || len(u2.State.Listeners[0].Routes) != 1 || u2.State.Versions[ClusterType] != "7" {
			t.Fatalf("handed-over state: %+v", u2.State)
		}
		u2.Done(nil)
		cp2 := &controlPlane{tb: t, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), notify: make(chan struct{}, 1)}
		cp2.set("7", resources(t, "127.0.0.1:9007"))
		cp2.serve(addr)
		r, _ := cp2.waitRequest(0, "first cds request", func(r seenRequest) bool { return r.typeURL == ClusterType })
		if p == ProtocolSotW && r.version != "7" {
			t.Errorf("resumed with version_info %q, want 7", r.version)
		}
		if p == ProtocolDelta && r.initial["backend"] == "" {
			t.Errorf("resumed without initial_resource_versions: %v", r.initial)
		}
		_ = strings.TrimSpace
	})
}

// tlsResources: listener "https" whose certificate comes by SDS from
// secret "cert", with content certPEM.
func tlsResources(tb testing.TB, certPEM string) map[resourcev3.Type][]types.Resource {
	tb.Helper()
	res := resources(tb, "127.0.0.1:9001")
	ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
	dtc, err := anypb.New(&tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: "cert", SdsConfig: ads}},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	lis := res[resourcev3.ListenerType][0].(*listenerv3.Listener)
	lis.FilterChains[0].TransportSocket = &corev3.TransportSocket{Name: tlsSocketName, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: dtc}}
	res[resourcev3.SecretType] = []types.Resource{&tlsv3.Secret{Name: "cert", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: certPEM}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "KEY of " + certPEM}},
	}}}}
	return res
}

func TestCertificateRotatedBySDS(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", tlsResources(t, "CERT-1"))
		c, _ := startClient(t, cp, p, nil)
		u := nextUpdate(t, c, 10*time.Second)
		certOf := func(st *State) (string, string) {
			t.Helper()
			if len(st.Listeners) != 1 || st.Listeners[0].TLS == nil || len(st.Listeners[0].TLS.Certificates) != 1 {
				t.Fatalf("listeners %+v: want one with one certificate", st.Listeners)
			}
			pair := st.Listeners[0].TLS.Certificates[0]
			b, err := os.ReadFile(pair.Cert)
			if err != nil {
				t.Fatal(err)
			}
			return pair.Cert, string(b)
		}
		path1, pem1 := certOf(u.State)
		if pem1 != "CERT-1" {
			t.Fatalf("certificate file holds %q", pem1)
		}
		if alpn := u.State.Listeners[0].TLS.ALPN; !slices.Equal(alpn, []string{"h2", "http/1.1"}) {
			t.Errorf("ALPN %v: the TOML default for an http listener was not filled in", alpn)
		}
		u.Done(nil)
		cp.set("2", tlsResources(t, "CERT-2"))
		u = nextUpdate(t, c, 10*time.Second)
		path2, pem2 := certOf(u.State)
		if pem2 != "CERT-2" || path2 == path1 {
			t.Fatalf("rotated certificate: %s holds %q (was %s)", path2, pem2, path1)
		}
		u.Done(nil)
		// The old file goes once nothing accepted names it.
		cp.waitRequest(0, "ACK of sds v2", func(r seenRequest) bool {
			return isACK(SecretType)(r) && (p == ProtocolDelta || r.version == "2")
		})
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := os.Stat(path1); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (the rotated-out certificate) still exists", path1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestReferenceToAnUnsubscribedTypeIsNACKed(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	cp.set("1", resources(t, "127.0.0.1:9001"))
	c, _ := startClient(t, cp, ProtocolDelta, func(cfg *Config) { cfg.Types = []TypeURL{ClusterType, ListenerType, RouteType} })
	nack, _ := cp.waitRequest(0, "NACK of cds", func(r seenRequest) bool { return r.errorMsg != "" })
	if !strings.Contains(nack.errorMsg, `eds "backend" is referenced but eds is not subscribed`) {
		t.Errorf("NACK %q", nack.errorMsg)
	}
	select {
	case u := <-c.Updates():
		if len(u.State.Clusters) != 0 {
			t.Errorf("an Update with the cluster whose endpoints cannot come: %+v", u.State.Clusters)
		}
		u.Done(nil)
	default:
	}
}

// resourcesFor is the fixture with its cluster (and endpoints, and the
// route to it) named cluster.
func resourcesFor(tb testing.TB, cluster, endpoint string) map[resourcev3.Type][]types.Resource {
	res := resources(tb, endpoint)
	res[resourcev3.ClusterType][0].(*clusterv3.Cluster).Name = cluster
	res[resourcev3.EndpointType][0].(*endpointv3.ClusterLoadAssignment).ClusterName = cluster
	rc := res[resourcev3.RouteType][0].(*routev3.RouteConfiguration)
	rc.VirtualHosts[0].Routes[0].GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: cluster}
	return res
}

// Make before break: a route never reaches an Update before the cluster
// it names, nor after the cluster is gone, whatever order the server's
// responses take.
func TestRoutesNeverNameAClusterTheUpdateLacks(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("0", resourcesFor(t, "blue", "127.0.0.1:9000"))
		c, _ := startClient(t, cp, p, func(cfg *Config) { cfg.StaticClusters = []string{} })
		check := func(u *Update) {
			t.Helper()
			have := map[string]bool{}
			for _, cl := range u.State.Clusters {
				have[cl.Name] = true
			}
			for _, l := range u.State.Listeners {
				for _, r := range l.Routes {
					if r.Cluster != "" && !have[r.Cluster] {
						t.Fatalf("an Update whose route names cluster %q, which it lacks (clusters %v)", r.Cluster, have)
					}
				}
			}
		}
		u := nextUpdate(t, c, 10*time.Second)
		check(u)
		u.Done(nil)
		for i := 1; i <= 10; i++ {
			name := []string{"blue", "green"}[i%2]
			cp.set(fmt.Sprint(i), resourcesFor(t, name, fmt.Sprintf("127.0.0.1:%d", 9000+i)))
			// Until the route names the new cluster, bounded.
			for n := 0; ; n++ {
				if n == 5 {
					t.Fatalf("round %d: 5 Updates and the route does not name %s yet", i, name)
				}
				u := nextUpdate(t, c, 10*time.Second)
				check(u)
				u.Done(nil)
				if len(u.State.Listeners) == 1 && len(u.State.Listeners[0].Routes) == 1 && u.State.Listeners[0].Routes[0].Cluster == name {
					break
				}
			}
		}
	})
}

// A SotW server answers a NACK by sending the same state again; the client
// refuses it again itself, with the same words and after a delay that
// grows, instead of handing it to the main goroutine or looping at the
// speed of a round trip.
func TestRefusedSetSentAgainIsRefusedAgainAfterADelay(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	cp.set("1", resources(t, "127.0.0.1:9001"))
	c, _ := startClient(t, cp, ProtocolSotW, nil)
	nextUpdate(t, c, 10*time.Second).Done(nil)
	cp.set("2", resources(t, "127.0.0.1:9002"))
	u := nextUpdate(t, c, 10*time.Second)
	const why = "refused by the test"
	u.Done(errors.New(why))
	isNACK := func(r seenRequest) bool { return r.typeURL == EndpointType && r.errorMsg != "" }
	first, i := cp.waitRequest(0, "NACK", isNACK)
	second, j := cp.waitRequest(i+1, "second NACK", isNACK)
	third, _ := cp.waitRequest(j+1, "third NACK", isNACK)
	for _, r := range []seenRequest{second, third} {
		if r.errorMsg != why {
			t.Errorf("repeated NACK says %q, want %q", r.errorMsg, why)
		}
	}
	d1, d2 := second.arrivedAt.Sub(first.arrivedAt), third.arrivedAt.Sub(second.arrivedAt)
	t.Logf("NACK intervals: %v, %v", d1, d2)
	if d1 < renackDelayBase || d2 < 2*renackDelayBase {
		t.Errorf("NACK intervals %v, %v: want at least %v, then %v", d1, d2, renackDelayBase, 2*renackDelayBase)
	}
	select {
	case u := <-c.Updates():
		t.Errorf("the refused set was handed over again: %+v", u.State.Clusters)
		u.Done(nil)
	default:
	}
	// A real change is still taken.
	cp.set("3", resources(t, "127.0.0.1:9003"))
	u = nextUpdate(t, c, 10*time.Second)
	if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9003"}) {
		t.Fatalf("after the repeated NACKs: endpoints %v", got)
	}
	u.Done(nil)
}

// A set the mapping refuses (an unsupported field) and the SotW server
// sends again unchanged is refused again only after the doubling delay,
// not at the speed of a round trip (issue 23).
func TestUnsupportedFieldSentAgainIsRefusedAgainAfterADelay(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	cp.set("1", resources(t, "127.0.0.1:9001"))
	c, ev := startClient(t, cp, ProtocolSotW, nil)
	nextUpdate(t, c, 10*time.Second).Done(nil)
	cp.set("2", resources(t, "127.0.0.1:9001", func(cl *clusterv3.Cluster) {
		cl.LbSubsetConfig = &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT}
	}))
	isNACK := func(r seenRequest) bool { return r.typeURL == ClusterType && r.errorMsg != "" }
	first, i := cp.waitRequest(0, "NACK of cds", isNACK)
	second, j := cp.waitRequest(i+1, "second NACK of cds", isNACK)
	third, _ := cp.waitRequest(j+1, "third NACK of cds", isNACK)
	const want = `cluster "backend": field "lb_subset_config" is not supported by hotproxy`
	for _, r := range []seenRequest{first, second, third} {
		if r.errorMsg != want {
			t.Errorf("NACK says %q, want %q", r.errorMsg, want)
		}
	}
	d1, d2 := second.arrivedAt.Sub(first.arrivedAt), third.arrivedAt.Sub(second.arrivedAt)
	t.Logf("NACK intervals: %v, %v", d1, d2)
	if d1 < renackDelayBase || d2 < 2*renackDelayBase {
		t.Errorf("NACK intervals %v, %v: want at least %v, then %v", d1, d2, renackDelayBase, 2*renackDelayBase)
	}
	ev.mu.Lock()
	if n := len(ev.rejected); n > 3 {
		t.Errorf("%d UpdateRejected events for 3 NACKs", n)
	}
	ev.mu.Unlock()
	// A good set is still taken.
	cp.set("3", resources(t, "127.0.0.1:9003"))
	u := nextUpdate(t, c, 10*time.Second)
	if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9003"}) {
		t.Fatalf("after the repeated NACKs: endpoints %v", got)
	}
	u.Done(nil)
}

// setPerType sets a snapshot whose types have versions of their own
// (cachev3.NewSnapshot gives every type the same one).
func (cp *controlPlane) setPerType(versions map[resourcev3.Type]string, res map[resourcev3.Type][]types.Resource) {
	cp.tb.Helper()
	snap := &cachev3.Snapshot{}
	for typ, v := range versions {
		snap.Resources[cachev3.GetResponseType(typ)] = cachev3.NewResources(v, res[typ])
	}
	if err := cp.cache.SetSnapshot(context.Background(), testNode, snap); err != nil {
		cp.tb.Fatal(err)
	}
}

// A secret that came before any listener named it (go-control-plane
// answers a SotW request with no names with every secret) is kept: the
// listener that names it later is not refused for want of it, although
// the server, holding the version ACKed, does not send it again
// (issue 23).
func TestSecretSentBeforeItsListenerIsKept(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0")
	plain, withTLS := resources(t, "127.0.0.1:9001"), tlsResources(t, "CERT-NEW")
	plain[resourcev3.SecretType] = withTLS[resourcev3.SecretType]
	all := func(v string) map[resourcev3.Type]string {
		return map[resourcev3.Type]string{resourcev3.ListenerType: v, resourcev3.RouteType: v, resourcev3.ClusterType: v,
			resourcev3.EndpointType: v, resourcev3.SecretType: v}
	}
	cp.setPerType(all("1"), resources(t, "127.0.0.1:9001"))
	c, ev := startClient(t, cp, ProtocolSotW, func(cfg *Config) { cfg.InitialFetchTimeout = 3 * time.Second })
	nextUpdate(t, c, 10*time.Second).Done(nil)
	cp.waitRequest(0, "ACK of lds v1", isACK(ListenerType))

	// The secret alone (nothing names it yet)...
	v := all("1")
	v[resourcev3.SecretType] = "2"
	from := cp.count()
	cp.setPerType(v, plain)
	cp.waitRequest(from, "ACK of sds v2", func(r seenRequest) bool { return isACK(SecretType)(r) && r.version == "2" })
	// ...then the listener that names it, the secret unchanged.
	v[resourcev3.ListenerType] = "3"
	cp.setPerType(v, withTLS)
	start := time.Now()
	u := nextUpdate(t, c, 10*time.Second)
	if len(u.State.Listeners) != 1 || u.State.Listeners[0].TLS == nil || len(u.State.Listeners[0].TLS.Certificates) != 1 {
		t.Fatalf("listeners %+v: want one with the SDS certificate", u.State.Listeners)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("the Update came after %v: it waited for a secret the client had", waited)
	}
	b, err := os.ReadFile(u.State.Listeners[0].TLS.Certificates[0].Cert)
	if err != nil || string(b) != "CERT-NEW" {
		t.Fatalf("certificate file: %q, %v; want CERT-NEW", b, err)
	}
	u.Done(nil)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.rejected) != 0 {
		t.Errorf("refused: %q", ev.rejected)
	}
}

// After the main goroutine refused a whole set (here: one adding a
// cluster and its endpoints), the next good set, which the SotW server
// sends as a change of some types only, becomes an Update (issue 23).
func TestGoodSetAfterAWholeSetRefusedIsAnUpdate(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, _ := startClient(t, cp, p, nil)
		nextUpdate(t, c, 10*time.Second).Done(nil)
		cp.waitRequest(0, "ACK of eds v1", isACK(EndpointType))

		bad := resources(t, "127.0.0.1:9001")
		extra := resourcesFor(t, "control_plane", "127.0.0.1:9100")
		bad[resourcev3.ClusterType] = append(bad[resourcev3.ClusterType], extra[resourcev3.ClusterType]...)
		bad[resourcev3.EndpointType] = append(bad[resourcev3.EndpointType], extra[resourcev3.EndpointType]...)
		cp.set("2", bad)
		u := nextUpdate(t, c, 10*time.Second)
		if len(u.State.Clusters) != 2 {
			t.Fatalf("v2 clusters %+v, want backend and control_plane", u.State.Clusters)
		}
		u.Done(errors.New(`dynamic cluster "control_plane": the name of a static cluster`))
		cp.waitRequest(0, "NACK of cds", func(r seenRequest) bool { return r.typeURL == ClusterType && r.errorMsg != "" })

		cp.set("3", resources(t, "127.0.0.1:9001"))
		cp.set("4", resources(t, "127.0.0.1:9004"))
		deadline := time.Now().Add(10 * time.Second)
		for {
			u := nextUpdate(t, c, time.Until(deadline))
			got := endpointsOf(u.State, "backend")
			u.Done(nil)
			if slices.Equal(got, []string{"127.0.0.1:9004"}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no Update with v4's endpoints; last %v", got)
			}
		}
	})
}
