package xds

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/hotproxy/hotproxy/config"
)

// Every allow-list entry names a real message and real fields: a typo
// there would refuse a supported field, or name nothing.
func TestSupportedFieldsExist(t *testing.T) {
	for msg, fields := range supportedFields {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(msg)
		if err != nil {
			t.Errorf("allow-list: message %s: %v", msg, err)
			continue
		}
		md := d.(protoreflect.MessageDescriptor)
		for _, f := range fields {
			if md.Fields().ByName(f) == nil {
				t.Errorf("allow-list: %s has no field %s", msg, f)
			}
		}
	}
}

func testMapper(t testing.TB) *mapper {
	t.Helper()
	files, cleanup, err := newSecretFiles(t.TempDir() + "/s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	return &mapper{files: files}
}

func parse(t testing.TB, js string, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal([]byte(js), m); err != nil {
		t.Fatalf("fixture: %v\n%s", err, js)
	}
}

const hcmRDS = `{"name":"envoy.filters.network.http_connection_manager","typed_config":{
  "@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
  "stat_prefix":"web","rds":{"route_config_name":"r","config_source":{"ads":{}}},
  "http_filters":[{"name":"envoy.filters.http.router","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}`

func TestMapListener(t *testing.T) {
	cases := []struct {
		name, js string
		check    func(t *testing.T, ml *mappedListener)
		err      string
	}{
		{name: "http with RDS", js: `{"name":"web","address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},
			"filter_chains":[{"filters":[` + hcmRDS + `]}]}`,
			check: func(t *testing.T, ml *mappedListener) {
				if ml.l.Protocol != "http" || ml.l.Address != "127.0.0.1:8080" || ml.rds != "r" || !ml.l.HTTP2Cleartext {
					t.Errorf("%+v rds %q", ml.l, ml.rds)
				}
			}},
		{name: "http with inline routes and timeouts", js: `{"name":"web","address":{"socket_address":{"address":"::1","port_value":80}},
			"filter_chains":[{"filters":[{"name":"hcm","typed_config":{
			"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
			"stat_prefix":"w","codec_type":"HTTP1","request_timeout":"7s","request_headers_timeout":"3s","max_request_headers_kb":32,
			"common_http_protocol_options":{"idle_timeout":"20s"},
			"route_config":{"name":"inline","virtual_hosts":[{"name":"a","domains":["a.example.com"],"routes":[{"match":{"path":"/x"},"route":{"cluster":"c1"}}]}]},
			"http_filters":[{"name":"envoy.filters.http.router"}]}}]}]}`,
			check: func(t *testing.T, ml *mappedListener) {
				l := ml.l
				if l.Address != "[::1]:80" || l.HTTP2Cleartext || l.RequestTimeout.D() != 7*time.Second || l.HeaderTimeout.D() != 3*time.Second ||
					l.IdleTimeout.D() != 20*time.Second || l.MaxHeaderBytes != 32<<10 {
					t.Errorf("%+v", l)
				}
				want := []config.Route{
					{Host: "a.example.com", Path: "/x", Cluster: "c1"},
					{Host: "a.example.com", Prefix: "/", DirectResponse: &config.DirectResponse{Status: 404, Body: "no route\n"}},
				}
				if !reflect.DeepEqual(l.Routes, want) {
					t.Errorf("routes %+v", l.Routes)
				}
			}},
		{name: "tcp proxy", js: `{"name":"db","address":{"socket_address":{"address":"127.0.0.1","port_value":5432}},
			"filter_chains":[{"filters":[{"name":"tcp","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy","stat_prefix":"db","cluster":"pg","idle_timeout":"600s"}}]}]}`,
			check: func(t *testing.T, ml *mappedListener) {
				if ml.l.Protocol != "tcp" || ml.l.Cluster != "pg" || ml.l.IdleTimeout.D() != 10*time.Minute {
					t.Errorf("%+v", ml.l)
				}
			}},
		{name: "TLS passthrough by SNI", js: `{"name":"sni","address":{"socket_address":{"address":"127.0.0.1","port_value":443}},
			"listener_filters":[{"name":"envoy.filters.listener.tls_inspector"}],
			"filter_chains":[
			 {"filter_chain_match":{"server_names":["a.example.com"]},"filters":[{"name":"tcp","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy","stat_prefix":"a","cluster":"a"}}]},
			 {"filters":[{"name":"tcp","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy","stat_prefix":"d","cluster":"dflt"}}]}]}`,
			check: func(t *testing.T, ml *mappedListener) {
				if ml.l.Cluster != "dflt" || len(ml.l.SNIRoutes) != 1 || ml.l.SNIRoutes[0].Cluster != "a" || ml.l.SNIRoutes[0].ServerNames[0] != "a.example.com" {
					t.Errorf("%+v", ml.l)
				}
			}},
		{name: "TLS with SNI certificates, SDS and ALPN", js: `{"name":"https","address":{"socket_address":{"address":"127.0.0.1","port_value":8443}},
			"filter_chains":[
			 {"filter_chain_match":{"server_names":["b.example.com"]},"filters":[` + hcmRDS + `],"transport_socket":{"name":"envoy.transport_sockets.tls","typed_config":{
			  "@type":"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
			  "common_tls_context":{"alpn_protocols":["h2","http/1.1"],"tls_params":{"tls_minimum_protocol_version":"TLSv1_3"},"tls_certificate_sds_secret_configs":[{"name":"b-cert","sds_config":{"ads":{}}}]}}}},
			 {"filters":[` + hcmRDS + `],"transport_socket":{"name":"envoy.transport_sockets.tls","typed_config":{
			  "@type":"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
			  "common_tls_context":{"alpn_protocols":["h2","http/1.1"],"tls_params":{"tls_minimum_protocol_version":"TLSv1_3"},
			   "tls_certificates":[{"certificate_chain":{"inline_string":"CERT-A"},"private_key":{"inline_string":"KEY-A"}}]}}}}]}`,
			check: func(t *testing.T, ml *mappedListener) {
				tl := ml.l.TLS
				if tl == nil || len(tl.Certificates) != 2 || tl.MinVersion != "1.3" || !reflect.DeepEqual(tl.ALPN, []string{"h2", "http/1.1"}) {
					t.Fatalf("%+v", tl)
				}
				if !reflect.DeepEqual(ml.certSDS, []string{"", "b-cert"}) {
					t.Errorf("certSDS %q: the default chain's pair first, then b's from SDS", ml.certSDS)
				}
				cert, _ := os.ReadFile(tl.Certificates[0].Cert)
				key, _ := os.ReadFile(tl.Certificates[0].Key)
				fi, err := os.Stat(tl.Certificates[0].Key)
				if string(cert) != "CERT-A" || string(key) != "KEY-A" || err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("inline pair written as %q/%q, key mode %v (%v)", cert, key, fi.Mode(), err)
				}
				if ml.l.HTTP2Cleartext {
					t.Error("h2c set on a TLS listener")
				}
			}},
		{name: "unsupported listener field", js: `{"name":"web","address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},
			"per_connection_buffer_limit_bytes":1024,"filter_chains":[{"filters":[` + hcmRDS + `]}]}`,
			err: `listener "web": field "per_connection_buffer_limit_bytes" is not supported by hotproxy`},
		{name: "unsupported field inside the HCM", js: `{"name":"web","address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},
			"filter_chains":[{"filters":[{"name":"hcm","typed_config":{
			"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
			"stat_prefix":"w","use_remote_address":true,"rds":{"route_config_name":"r","config_source":{"ads":{}}},"http_filters":[{"name":"envoy.filters.http.router"}]}}]}]}`,
			err: `listener "web": field "filter_chains[0].filters[0].typed_config.use_remote_address" is not supported by hotproxy`},
		{name: "an HTTP filter other than the router", js: `{"name":"web","address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},
			"filter_chains":[{"filters":[{"name":"hcm","typed_config":{
			"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
			"stat_prefix":"w","rds":{"route_config_name":"r","config_source":{"ads":{}}},
			"http_filters":[{"name":"cors","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router","suppress_envoy_headers":true}}]}}]}]}`,
			err: `typed_config.http_filters[0].typed_config.suppress_envoy_headers" is not supported by hotproxy`},
		{name: "RDS not over ADS", js: `{"name":"web","address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},
			"filter_chains":[{"filters":[{"name":"hcm","typed_config":{
			"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
			"stat_prefix":"w","rds":{"route_config_name":"r","config_source":{"path":"/etc/r.yaml"}},"http_filters":[{"name":"envoy.filters.http.router"}]}}]}]}`,
			err: `rds.config_source.path" is not supported by hotproxy`},
		{name: "client certificates", js: `{"name":"https","address":{"socket_address":{"address":"127.0.0.1","port_value":8443}},
			"filter_chains":[{"filters":[` + hcmRDS + `],"transport_socket":{"name":"envoy.transport_sockets.tls","typed_config":{
			  "@type":"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
			  "common_tls_context":{"tls_certificates":[{"certificate_chain":{"filename":"/c.pem"},"private_key":{"filename":"/k.pem"}}],
			  "validation_context":{"trusted_ca":{"filename":"/ca.pem"}}}}}}]}`,
			err: `validation_context": client certificates are not supported by hotproxy on a listener`},
		{name: "no address", js: `{"name":"web","filter_chains":[{"filters":[` + hcmRDS + `]}]}`,
			err: `listener "web": field "address.socket_address": missing`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l listenerv3.Listener
			parse(t, tc.js, &l)
			ml, err := testMapper(t).listener(&l)
			checkMapped(t, err, tc.err)
			if err == nil && tc.check != nil {
				tc.check(t, ml)
			}
		})
	}
}

func checkMapped(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case want != "" && err == nil:
		t.Fatalf("accepted; want an error with %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q\nwant it to contain %q", err, want)
	}
}

func TestMapRouteConfiguration(t *testing.T) {
	notFound := &config.DirectResponse{Status: 404, Body: "no route\n"}
	cases := []struct {
		name, js string
		want     []config.Route
		hash     map[string]string
		err      string
	}{
		{name: "virtual hosts ordered by specificity, each closed by a 404", js: `{"name":"r","virtual_hosts":[
			{"name":"any","domains":["*"],"routes":[{"match":{"prefix":"/"},"route":{"cluster":"dflt"}}]},
			{"name":"wild","domains":["*.example.com"],"routes":[{"match":{"prefix":"/api/"},"route":{"cluster":"api","timeout":"2s",
			  "retry_policy":{"retry_on":"5xx,connect-failure","num_retries":3,"per_try_timeout":"0.5s"}}}]},
			{"name":"exact","domains":["www.example.com","example.com"],"routes":[{"match":{"path":"/health"},"direct_response":{"status":200,"body":{"inline_string":"ok"}}}]}]}`,
			want: []config.Route{
				{Host: "www.example.com", Path: "/health", DirectResponse: &config.DirectResponse{Status: 200, Body: "ok"}},
				{Host: "www.example.com", Prefix: "/", DirectResponse: notFound},
				{Host: "example.com", Path: "/health", DirectResponse: &config.DirectResponse{Status: 200, Body: "ok"}},
				{Host: "example.com", Prefix: "/", DirectResponse: notFound},
				{Host: "*.example.com", Prefix: "/api/", Cluster: "api", Timeout: config.Duration(2 * time.Second),
					RetryOn: []string{"5xx", "connect-failure"}, NumRetries: new(3), PerTryTimeout: config.Duration(500 * time.Millisecond)},
				{Host: "*.example.com", Prefix: "/", DirectResponse: notFound},
				{Prefix: "/", Cluster: "dflt"},
			}},
		{name: "one weighted cluster with all the weight, hash policy", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":100},{"name":"b","weight":0}]},
			 "hash_policy":[{"header":{"header_name":"X-User"}}]}}]}]}`,
			want: []config.Route{{Prefix: "/", Cluster: "a"}}, hash: map[string]string{"a": "header:x-user"}},
		{name: "traffic split, a cluster with weight 0 left out, hash policy on both", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":75},{"name":"c","weight":0},{"name":"b","weight":25}],"total_weight":100},
			 "hash_policy":[{"header":{"header_name":"X-User"}}]}}]}]}`,
			want: []config.Route{{Prefix: "/", WeightedClusters: []config.WeightedCluster{{Cluster: "a", Weight: 75}, {Cluster: "b", Weight: 25}}}},
			hash: map[string]string{"a": "header:x-user", "b": "header:x-user"}},
		{name: "header matches", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/","headers":[{"name":"X-Canary","exact_match":"1"},{"name":":method","string_match":{"exact":"POST"}},
			  {"name":"x-env","prefix_match":"prod","invert_match":true},{"name":"x-a","string_match":{"prefix":"Ab","ignore_case":true}},
			  {"name":"x-user","present_match":true},{"name":"x-debug","present_match":false},{"name":"x-e","exact_match":""}]},"route":{"cluster":"a"}}]}]}`,
			want: []config.Route{{Prefix: "/", Cluster: "a", Headers: []config.HeaderMatch{
				{Name: "x-canary", Exact: new("1")}, {Name: ":method", Exact: new("POST")},
				{Name: "x-env", Prefix: "prod", Invert: true}, {Name: "x-a", Prefix: "Ab", IgnoreCase: true},
				{Name: "x-user", Present: true}, {Name: "x-debug", Present: true, Invert: true}, {Name: "x-e", Exact: new("")}}}}},
		{name: "header match by regex", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/","headers":[{"name":"x-canary","safe_regex_match":{"regex":"1|yes"}}]},"route":{"cluster":"a"}}]}]}`,
			err: `route_configuration "r": field "virtual_hosts[0].routes[0].match.headers[0].safe_regex_match" is not supported by hotproxy`},
		{name: "header match by suffix", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/","headers":[{"name":"x-a","exact_match":"1"},{"name":"x-b","string_match":{"suffix":"z"}}]},"route":{"cluster":"a"}}]}]}`,
			err: `route_configuration "r": field "virtual_hosts[0].routes[0].match.headers[1].string_match.suffix" is not supported by hotproxy`},
		{name: "header match by range", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/","headers":[{"name":"x-a","range_match":{"start":1,"end":5}}]},"route":{"cluster":"a"}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].match.headers[0].range_match" is not supported by hotproxy`},
		{name: "header match of :path", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/","headers":[{"name":":path","exact_match":"/"}]},"route":{"cluster":"a"}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].match.headers[0].name": ":path": of the pseudo-headers hotproxy matches only ":method"`},
		{name: "split total_weight not the sum", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":50},{"name":"b","weight":40}],"total_weight":100}}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].route.weighted_clusters.total_weight": 100: not the sum of the clusters' weights (90)`},
		{name: "split weight too high", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":1},{"name":"b","weight":2000000}]}}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].route.weighted_clusters.clusters[1].weight": 2000000: hotproxy takes weights up to 1000000`},
		{name: "split without weight", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":0},{"name":"b","weight":0}]}}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].route.weighted_clusters.clusters": no cluster has a weight above 0`},
		{name: "split by a header", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"weighted_clusters":{"clusters":[{"name":"a","weight":1},{"name":"b","weight":1}],"header_name":"x-w"}}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].route.weighted_clusters.header_name" is not supported by hotproxy`},
		{name: "prefix rewrite", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/v1/"},"route":{"cluster":"a","prefix_rewrite":"/"}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].route.prefix_rewrite" is not supported by hotproxy`},
		{name: "retry condition hotproxy lacks", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[
			{"match":{"prefix":"/"},"route":{"cluster":"a","retry_policy":{"retry_on":"retriable-4xx"}}}]}]}`,
			err: `"retriable-4xx" is not supported by hotproxy`},
		{name: "prefix wildcard domain", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["www.*"],"routes":[{"match":{"prefix":"/"},"route":{"cluster":"a"}}]}]}`,
			err: `prefix wildcards are not supported by hotproxy`},
		{name: "redirect", js: `{"name":"r","virtual_hosts":[{"name":"a","domains":["*"],"routes":[{"match":{"prefix":"/"},"redirect":{"https_redirect":true}}]}]}`,
			err: `field "virtual_hosts[0].routes[0].redirect" is not supported by hotproxy`},
	}
	// 400 domains by 300 routes: 120,400 routes once laid out.
	many := `{"name":"r","virtual_hosts":[{"name":"a","domains":[`
	for i := 0; i < 400; i++ {
		if i > 0 {
			many += ","
		}
		many += fmt.Sprintf(`"h%d.example.com"`, i)
	}
	many += `],"routes":[`
	for i := 0; i < 300; i++ {
		if i > 0 {
			many += ","
		}
		many += fmt.Sprintf(`{"match":{"path":"/p%d"},"route":{"cluster":"a"}}`, i)
	}
	many += `]}]}`
	cases = append(cases, struct {
		name, js string
		want     []config.Route
		hash     map[string]string
		err      string
	}{name: "too many routes once laid out", js: many, err: `field "virtual_hosts": 120400 routes once every domain has its own (hotproxy takes at most 100000)`})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rc routev3.RouteConfiguration
			parse(t, tc.js, &rc)
			routes, hash, err := routeConfiguration(&rc)
			checkMapped(t, err, tc.err)
			if err != nil {
				return
			}
			if !reflect.DeepEqual(routes, tc.want) {
				t.Errorf("routes\n got %+v\nwant %+v", routes, tc.want)
			}
			if tc.hash != nil && !reflect.DeepEqual(hash, tc.hash) {
				t.Errorf("hash %v, want %v", hash, tc.hash)
			}
		})
	}
}

func TestMapCluster(t *testing.T) {
	cases := []struct {
		name, js string
		check    func(t *testing.T, mc *mappedCluster)
		err      string
	}{
		{name: "EDS, ring hash, resilience, HTTP/2", js: `{"name":"api","type":"EDS","eds_cluster_config":{"eds_config":{"ads":{}},"service_name":"api-v2"},
			"connect_timeout":"1s","lb_policy":"RING_HASH",
			"health_checks":[{"timeout":"1s","interval":"2s","unhealthy_threshold":3,"healthy_threshold":2,"http_health_check":{"path":"/healthz","expected_statuses":[{"start":200,"end":204}]}}],
			"outlier_detection":{"consecutive_5xx":7,"base_ejection_time":"10s"},
			"circuit_breakers":{"thresholds":[{"max_connections":10,"max_pending_requests":20,"max_requests":30,"max_retries":4}]},
			"typed_extension_protocol_options":{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions":{
			  "@type":"type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions","explicit_http_config":{"http2_protocol_options":{}},
			  "common_http_protocol_options":{"idle_timeout":"30s"}}}}`,
			check: func(t *testing.T, mc *mappedCluster) {
				c := mc.c
				if mc.eds != "api-v2" || c.LBPolicy != "ring_hash" || c.ConnectTimeout.D() != time.Second || !c.HTTP2 || c.IdleTimeout.D() != 30*time.Second {
					t.Errorf("%+v eds %q", c, mc.eds)
				}
				want := &config.HealthCheck{Path: "/healthz", ExpectedStatuses: []int{200, 201, 202, 203}, Interval: config.Duration(2 * time.Second),
					Timeout: config.Duration(time.Second), UnhealthyThreshold: 3, HealthyThreshold: 2}
				if !reflect.DeepEqual(c.HealthCheck, want) {
					t.Errorf("health check %+v", c.HealthCheck)
				}
				od := c.OutlierDetection
				if *od.Consecutive5xx != 7 || *od.ConsecutiveConnectFailure != 7 || od.BaseEjectionTime.D() != 10*time.Second || *od.MaxEjectionPercent != 10 {
					t.Errorf("outlier detection %+v (Envoy's max_ejection_percent default is 10)", od)
				}
				cb := c.CircuitBreakers
				if cb.MaxConnections != 10 || cb.MaxPendingRequests != 20 || cb.MaxRequests != 30 || *cb.MaxRetries != 4 {
					t.Errorf("circuit breakers %+v", cb)
				}
			}},
		{name: "STRICT_DNS with upstream TLS", js: `{"name":"ext","type":"STRICT_DNS","dns_refresh_rate":"30s","lb_policy":"MAGLEV",
			"load_assignment":{"cluster_name":"ext","endpoints":[{"lb_endpoints":[
			  {"endpoint":{"address":{"socket_address":{"address":"api.example.com","port_value":443}}}},
			  {"endpoint":{"address":{"socket_address":{"address":"down.example.com","port_value":443}}},"health_status":"UNHEALTHY"}]}]},
			"transport_socket":{"name":"envoy.transport_sockets.tls","typed_config":{"@type":"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
			  "sni":"api.example.com","common_tls_context":{"validation_context":{"trusted_ca":{"inline_string":"CA-PEM"}},
			  "tls_certificate_sds_secret_configs":[{"name":"client","sds_config":{"ads":{}}}]}}}}`,
			check: func(t *testing.T, mc *mappedCluster) {
				c := mc.c
				if c.LBPolicy != "maglev" || c.DNSRefresh.D() != 30*time.Second || !reflect.DeepEqual(c.Endpoints, []string{"api.example.com:443"}) {
					t.Errorf("%+v (an UNHEALTHY endpoint is left out)", c)
				}
				ca, _ := os.ReadFile(c.TLS.CA)
				if c.TLS.ServerName != "api.example.com" || string(ca) != "CA-PEM" || mc.certSDS != "client" {
					t.Errorf("tls %+v certSDS %q", c.TLS, mc.certSDS)
				}
			}},
		{name: "subset load balancing", js: `{"name":"backend","type":"EDS","eds_cluster_config":{"eds_config":{"ads":{}}},"lb_subset_config":{"fallback_policy":"ANY_ENDPOINT"}}`,
			err: `cluster "backend": field "lb_subset_config" is not supported by hotproxy`},
		{name: "original destination", js: `{"name":"od","type":"ORIGINAL_DST","lb_policy":"CLUSTER_PROVIDED"}`,
			err: `cluster "od": field "type": ORIGINAL_DST is not supported by hotproxy`},
		{name: "unsupported health check field", js: `{"name":"b","type":"STATIC","load_assignment":{"cluster_name":"b","endpoints":[{"lb_endpoints":[{"endpoint":{"address":{"socket_address":{"address":"127.0.0.1","port_value":1}}}}]}]},
			"health_checks":[{"timeout":"1s","interval":"1s","unhealthy_threshold":1,"healthy_threshold":1,"http_health_check":{"path":"/","host":"x"}}]}`,
			err: `cluster "b": field "health_checks[0].http_health_check.host" is not supported by hotproxy`},
		{name: "invalid by the API's own rules", js: `{"name":"b","type":"STATIC","connect_timeout":"-1s"}`,
			err: `cluster "b": invalid Cluster.ConnectTimeout`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var cl clusterv3.Cluster
			parse(t, tc.js, &cl)
			mc, err := testMapper(t).cluster(&cl)
			checkMapped(t, err, tc.err)
			if err == nil && tc.check != nil {
				tc.check(t, mc)
			}
		})
	}
}

func TestMapEndpointsAndSecrets(t *testing.T) {
	m := testMapper(t)
	var cla endpointv3.ClusterLoadAssignment
	parse(t, `{"cluster_name":"b","endpoints":[{"locality":{"zone":"z1"},"lb_endpoints":[
		{"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}}},
		{"endpoint":{"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}},"health_status":"DRAINING"},
		{"endpoint":{"address":{"socket_address":{"address":"10.0.0.3","port_value":80}}},"health_status":"HEALTHY"}]}]}`, &cla)
	eps, err := m.loadAssignment(&cla)
	if err != nil || !reflect.DeepEqual(eps, []string{"10.0.0.1:80", "10.0.0.3:80"}) {
		t.Errorf("endpoints %v, %v", eps, err)
	}
	parse(t, `{"cluster_name":"b","endpoints":[{"priority":1,"lb_endpoints":[{"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}}}]}]}`, &cla)
	_, err = m.loadAssignment(&cla)
	checkMapped(t, err, `cluster_load_assignment "b": field "endpoints[0].priority" is not supported by hotproxy`)

	var s tlsv3.Secret
	parse(t, `{"name":"cert","tls_certificate":{"certificate_chain":{"inline_bytes":"Q0VSVA=="},"private_key":{"inline_string":"KEY"}}}`, &s)
	ms, err := m.secret(&s)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(ms.cert.Cert); string(b) != "CERT" {
		t.Errorf("cert file holds %q", b)
	}
	parse(t, `{"name":"ca","validation_context":{"trusted_ca":{"filename":"relative.pem"}}}`, &s)
	_, err = m.secret(&s)
	checkMapped(t, err, `secret "ca": field "validation_context.trusted_ca": filename "relative.pem": must be an absolute path`)
	parse(t, `{"name":"tk","session_ticket_keys":{"keys":[{"inline_bytes":"AAAA"}]}}`, &s)
	_, err = m.secret(&s)
	checkMapped(t, err, `secret "tk": field "session_ticket_keys" is not supported by hotproxy`)
}

func TestTLSParams(t *testing.T) {
	for _, tc := range []struct {
		js, min, max string
		suites       []string
		err          string
	}{
		{js: `{}`, min: "1.2", max: "1.3"},
		{js: `{"tls_minimum_protocol_version":"TLSv1_2","tls_maximum_protocol_version":"TLSv1_2","cipher_suites":["ECDHE-RSA-AES128-GCM-SHA256"]}`,
			min: "1.2", max: "1.2", suites: []string{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}},
		{js: `{"tls_minimum_protocol_version":"TLSv1_1"}`, err: "TLSv1_1 is not supported by hotproxy (TLSv1_2 or TLSv1_3)"},
		{js: `{"cipher_suites":["AES128-SHA"]}`, err: `cipher_suites: "AES128-SHA" is not supported by hotproxy`},
	} {
		var p tlsv3.TlsParameters
		parse(t, tc.js, &p)
		min, max, suites, err := tlsParams(&p)
		checkMapped(t, err, tc.err)
		if err == nil && (min != tc.min || max != tc.max || !reflect.DeepEqual(suites, tc.suites)) {
			t.Errorf("%s: %s %s %v", tc.js, min, max, suites)
		}
	}
}

// With no SecretDir, secrets go to a private directory of the client's
// own, removed when it is done.
func TestSecretFilesWithoutADirectory(t *testing.T) {
	files, cleanup, err := newSecretFiles("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := files.write([]byte("KEY"))
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.Stat(files.dir)
	key, _ := os.Stat(p)
	if dir.Mode().Perm() != 0o700 || key.Mode().Perm() != 0o600 {
		t.Errorf("directory %v, key %v: want 0700 and 0600", dir.Mode().Perm(), key.Mode().Perm())
	}
	if p2, _ := files.write([]byte("KEY")); p2 != p {
		t.Errorf("the same bytes got two files: %s, %s", p, p2)
	}
	cleanup()
	if _, err := os.Stat(files.dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after cleanup (%v)", files.dir, err)
	}
}

func TestParseType(t *testing.T) {
	for _, typ := range AllTypes {
		for _, s := range []string{typ.Name(), typ.Short(), string(typ)} {
			if got, err := ParseType(s); err != nil || got != typ {
				t.Errorf("ParseType(%q) = %v, %v; want %v", s, got, err, typ)
			}
		}
	}
	if _, err := ParseType("listener"); err == nil || !strings.Contains(err.Error(), "use listeners, routes") {
		t.Errorf("ParseType(listener): %v", err)
	}
}
