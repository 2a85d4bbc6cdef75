package xds

import (
	"reflect"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hotproxy/hotproxy/config"
)

// splitResources is the fixture of resources() with a second EDS
// cluster, "canary", and the routes given instead of its one.
func splitResources(tb testing.TB, routes ...*routev3.Route) map[resourcev3.Type][]types.Resource {
	tb.Helper()
	res := resources(tb, "127.0.0.1:9001")
	canary := proto.Clone(res[resourcev3.ClusterType][0]).(*clusterv3.Cluster)
	canary.Name = "canary"
	cla := proto.Clone(res[resourcev3.EndpointType][0]).(*endpointv3.ClusterLoadAssignment)
	cla.ClusterName = "canary"
	cla.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr("127.0.0.1", 9002)
	res[resourcev3.ClusterType] = append(res[resourcev3.ClusterType], canary)
	res[resourcev3.EndpointType] = append(res[resourcev3.EndpointType], cla)
	rc := res[resourcev3.RouteType][0].(*routev3.RouteConfiguration)
	rc.VirtualHosts[0].Routes = routes
	return res
}

func prefixMatch(p string, headers ...*routev3.HeaderMatcher) *routev3.RouteMatch {
	return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}, Headers: headers}
}

func split(weights map[string]uint32, order ...string) *routev3.Route_Route {
	wc := &routev3.WeightedCluster{}
	for _, name := range order {
		wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(weights[name])})
	}
	return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}}}
}

func toClusterAction(name string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}}
}

// TestWeightedSplitAndHeaderMatchesAreACKed: a route configuration with
// header matches (exact by string_match, :method, invert, present) and a
// weighted split from go-control-plane's server is mapped onto the
// routes the TOML file would write, and ACKed once applied.
func TestWeightedSplitAndHeaderMatchesAreACKed(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", splitResources(t,
			&routev3.Route{Match: prefixMatch("/",
				&routev3.HeaderMatcher{Name: "X-Canary", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
					MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "yes"}, IgnoreCase: true}}},
				&routev3.HeaderMatcher{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_PrefixMatch{PrefixMatch: "GE"}},
				&routev3.HeaderMatcher{Name: "x-debug", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}, InvertMatch: true}),
				Action: toClusterAction("canary")},
			&routev3.Route{Match: prefixMatch("/"), Action: split(map[string]uint32{"backend": 3, "canary": 1}, "backend", "canary")},
		))
		c, _ := startClient(t, cp, p, nil)
		u := nextUpdate(t, c, 10*time.Second)
		if len(u.State.Listeners) != 1 || len(u.State.Clusters) != 2 {
			t.Fatalf("state: %d listeners, %d clusters; want 1 and 2", len(u.State.Listeners), len(u.State.Clusters))
		}
		routes := u.State.Listeners[0].Routes
		if len(routes) != 2 {
			t.Fatalf("routes %+v, want 2", routes)
		}
		want := []config.HeaderMatch{
			{Name: "x-canary", Exact: new("yes"), IgnoreCase: true},
			{Name: ":method", Prefix: "GE"},
			{Name: "x-debug", Present: true, Invert: true},
		}
		if r := routes[0]; r.Cluster != "canary" || !reflect.DeepEqual(r.Headers, want) {
			t.Errorf("route 0: %+v, want cluster canary with headers %+v", r, want)
		}
		if r, ws := routes[1], []config.WeightedCluster{{Cluster: "backend", Weight: 3}, {Cluster: "canary", Weight: 1}}; r.Cluster != "" || !reflect.DeepEqual(r.WeightedClusters, ws) {
			t.Errorf("route 1: %+v, want weighted_clusters %+v", r, ws)
		}
		from := cp.count()
		u.Done(nil)
		cp.waitRequest(from, "ACK of rds v1", func(r seenRequest) bool { return isACK(RouteType)(r) && (p == ProtocolDelta || r.version == "1") })

		// 100:0 is the one cluster; then 0:100 the other.
		for i, w := range []map[string]uint32{{"backend": 100, "canary": 0}, {"backend": 0, "canary": 100}} {
			version := []string{"2", "3"}[i]
			cp.set(version, splitResources(t, &routev3.Route{Match: prefixMatch("/"), Action: split(w, "backend", "canary")}))
			u := nextUpdate(t, c, 10*time.Second)
			wantCluster := []string{"backend", "canary"}[i]
			if rs := u.State.Listeners[0].Routes; len(rs) != 1 || rs[0].Cluster != wantCluster || rs[0].WeightedClusters != nil {
				t.Errorf("v%s routes %+v, want all to %s", version, rs, wantCluster)
			}
			from := cp.count()
			u.Done(nil)
			cp.waitRequest(from, "ACK of rds v"+version, func(r seenRequest) bool { return isACK(RouteType)(r) && (p == ProtocolDelta || r.version == version) })
		}
	})
}

// TestRegexHeaderMatchIsNACKedWithItsField: a header matcher hotproxy
// does not implement (safe_regex_match) is refused by a NACK naming its
// path, and the refused routes never reach an Update.
func TestRegexHeaderMatchIsNACKedWithItsField(t *testing.T) {
	bothProtocols(t, func(t *testing.T, p Protocol) {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", splitResources(t, &routev3.Route{Match: prefixMatch("/"), Action: toClusterAction("backend")}))
		c, _ := startClient(t, cp, p, nil)
		nextUpdate(t, c, 10*time.Second).Done(nil)

		cp.set("2", splitResources(t, &routev3.Route{Match: prefixMatch("/",
			&routev3.HeaderMatcher{Name: "x-canary", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{SafeRegexMatch: &matcherv3.RegexMatcher{Regex: "1|yes"}}}),
			Action: toClusterAction("canary")}))
		nack, _ := cp.waitRequest(0, "NACK of rds", func(r seenRequest) bool { return r.typeURL == RouteType && r.errorMsg != "" })
		const want = `route_configuration "local_route": field "virtual_hosts[0].routes[0].match.headers[0].safe_regex_match" is not supported by hotproxy`
		if nack.errorMsg != want {
			t.Errorf("NACK error_detail %q, want %q", nack.errorMsg, want)
		}
		if p == ProtocolSotW && nack.version != "1" {
			t.Errorf("NACK version_info %q, want the last accepted, 1", nack.version)
		}
		// No Update for the refused routes: the next one is v3's.
		cp.set("3", splitResources(t, &routev3.Route{Match: prefixMatch("/",
			&routev3.HeaderMatcher{Name: "x-canary", HeaderMatchSpecifier: &routev3.HeaderMatcher_ExactMatch{ExactMatch: "1"}}),
			Action: toClusterAction("canary")}))
		u := nextUpdate(t, c, 10*time.Second)
		if rs := u.State.Listeners[0].Routes; len(rs) != 1 || rs[0].Cluster != "canary" || len(rs[0].Headers) != 1 || *rs[0].Headers[0].Exact != "1" {
			t.Errorf("the Update after the NACK has routes %+v, want v3's", rs)
		}
		if v := u.State.Versions[RouteType]; v == "2" {
			t.Errorf("rds version %q: the refused version was applied", v)
		}
		u.Done(nil)
	})
}
