package xds

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/hotproxy/hotproxy/config"
)

// exampleSet decodes examples/xds-snapshot.json into mapped resources.
func exampleSet(t testing.TB) map[TypeURL]map[string]*resource {
	t.Helper()
	data, err := os.ReadFile("../examples/xds-snapshot.json")
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	m := testMapper(t)
	set := map[TypeURL]map[string]*resource{}
	for key, kind := range map[string]struct {
		t   TypeURL
		new func() proto.Message
	}{
		"listeners": {ListenerType, func() proto.Message { return &listenerv3.Listener{} }},
		"routes":    {RouteType, func() proto.Message { return &routev3.RouteConfiguration{} }},
		"clusters":  {ClusterType, func() proto.Message { return &clusterv3.Cluster{} }},
		"endpoints": {EndpointType, func() proto.Message { return &endpointv3.ClusterLoadAssignment{} }},
	} {
		var items []json.RawMessage
		json.Unmarshal(f[key], &items)
		set[kind.t] = map[string]*resource{}
		for _, raw := range items {
			msg := kind.new()
			if err := protojson.Unmarshal(raw, msg); err != nil {
				t.Fatal(err)
			}
			a, _ := anypb.New(msg)
			r, err := decodeResource(kind.t, a, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := m.mapResource(kind.t, r); err != nil {
				t.Fatal(err)
			}
			set[kind.t][r.name] = r
		}
	}
	return set
}

// The mapped state is what the TOML file gives for the same
// configuration, and passes the same validation.
func TestMappedStateIsWhatTheTOMLFileGives(t *testing.T) {
	st, err := resolve(exampleSet(t))
	if err != nil {
		t.Fatal(err)
	}
	const toml = `
[[listeners]]
name = "web"
address = "127.0.0.1:10080"
protocol = "http"
http2_cleartext = true
routes = [
  { path = "/healthz", direct_response = { status = 200, body = "ok\n" } },
  { prefix = "/", cluster = "backend", timeout = "5s", retry_on = ["connect-failure", "reset"], num_retries = 2 },
]

[[clusters]]
name = "backend"
lb_policy = "least_request"
connect_timeout = "1s"
endpoints = ["127.0.0.1:9000"]
`
	want, err := config.Parse([]byte(toml), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Listeners, want.Listeners) {
		t.Errorf("listeners\n xds  %+v\n toml %+v", st.Listeners, want.Listeners)
	}
	if !reflect.DeepEqual(st.Clusters, want.Clusters) {
		t.Errorf("clusters\n xds  %+v\n toml %+v", st.Clusters, want.Clusters)
	}
	merged := *want
	merged.Listeners, merged.Clusters = st.Listeners, st.Clusters
	if err := merged.Validate(); err != nil {
		t.Errorf("the mapped state does not validate: %v", err)
	}
}

// A route's hash policy becomes its ring_hash cluster's hash_on.
func TestResolveHashPolicyIntoTheCluster(t *testing.T) {
	set := exampleSet(t)
	m := testMapper(t)
	var cl clusterv3.Cluster
	parse(t, `{"name":"backend","type":"EDS","eds_cluster_config":{"eds_config":{"ads":{}}},"lb_policy":"MAGLEV"}`, &cl)
	var rc routev3.RouteConfiguration
	parse(t, `{"name":"web_routes","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
		{"match":{"prefix":"/"},"route":{"cluster":"backend","hash_policy":[{"cookie":{"name":"session"}}]}}]}]}`, &rc)
	for typ, msg := range map[TypeURL]proto.Message{ClusterType: &cl, RouteType: &rc} {
		a, _ := anypb.New(msg)
		r, err := decodeResource(typ, a, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.mapResource(typ, r); err != nil {
			t.Fatal(err)
		}
		set[typ][r.name] = r
	}
	st, err := resolve(set)
	if err != nil {
		t.Fatal(err)
	}
	if st.Clusters[0].HashOn != "cookie:session" || st.Clusters[0].LBPolicy != "maglev" {
		t.Errorf("cluster %+v: want maglev hashing on cookie:session", st.Clusters[0])
	}
}
