package xds

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// The extension types a typed_config may hold: imported so that
	// their Any unpacks.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// supportedFields is the allow-list: per message, the fields hotproxy
// maps. A field set in a resource and not listed here is refused, never
// ignored (checkSupported), so that a control plane never believes a
// setting took effect when it did not. A message not listed at all is
// refused wherever it appears (but for the leaves in leafMessages). Adding
// a field here is adding its mapping (and a row in docs/xds.md).
var supportedFields = map[protoreflect.FullName][]protoreflect.Name{
	// Listener (LDS).
	"envoy.config.listener.v3.Listener":           {"name", "address", "filter_chains", "listener_filters"},
	"envoy.config.core.v3.Address":                {"socket_address"},
	"envoy.config.core.v3.SocketAddress":          {"address", "port_value"},
	"envoy.config.listener.v3.FilterChain":        {"name", "filter_chain_match", "filters", "transport_socket"},
	"envoy.config.listener.v3.FilterChainMatch":   {"server_names"},
	"envoy.config.listener.v3.Filter":             {"name", "typed_config"},
	"envoy.config.listener.v3.ListenerFilter":     {"name", "typed_config"},
	"envoy.config.core.v3.TransportSocket":        {"name", "typed_config"},
	"envoy.config.core.v3.ConfigSource":           {"ads", "resource_api_version"},
	"envoy.config.core.v3.AggregatedConfigSource": nil,
	"envoy.config.core.v3.DataSource":             {"filename", "inline_bytes", "inline_string"},
	"envoy.config.core.v3.HttpProtocolOptions":    {"idle_timeout"},
	"envoy.config.core.v3.Http1ProtocolOptions":   nil,
	"envoy.config.core.v3.Http2ProtocolOptions":   nil,

	"envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector": nil,
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager": {
		"stat_prefix", "codec_type", "rds", "route_config", "http_filters",
		"common_http_protocol_options", "request_timeout", "request_headers_timeout", "max_request_headers_kb"},
	"envoy.extensions.filters.network.http_connection_manager.v3.Rds":        {"config_source", "route_config_name"},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter": {"name", "typed_config"},
	"envoy.extensions.filters.http.router.v3.Router":                         nil,
	"envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy":                 {"stat_prefix", "cluster", "idle_timeout"},

	// TLS, downstream and upstream, and SDS.
	"envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext": {"common_tls_context"},
	"envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext":   {"common_tls_context", "sni"},
	"envoy.extensions.transport_sockets.tls.v3.CommonTlsContext": {"tls_params", "tls_certificates",
		"tls_certificate_sds_secret_configs", "validation_context", "validation_context_sds_secret_config", "alpn_protocols"},
	"envoy.extensions.transport_sockets.tls.v3.TlsParameters":                {"tls_minimum_protocol_version", "tls_maximum_protocol_version", "cipher_suites"},
	"envoy.extensions.transport_sockets.tls.v3.TlsCertificate":               {"certificate_chain", "private_key"},
	"envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext": {"trusted_ca"},
	"envoy.extensions.transport_sockets.tls.v3.SdsSecretConfig":              {"name", "sds_config"},
	"envoy.extensions.transport_sockets.tls.v3.Secret":                       {"name", "tls_certificate", "validation_context"},

	// RouteConfiguration (RDS, or inline).
	"envoy.config.route.v3.RouteConfiguration":                          {"name", "virtual_hosts"},
	"envoy.config.route.v3.VirtualHost":                                 {"name", "domains", "routes"},
	"envoy.config.route.v3.Route":                                       {"name", "match", "route", "direct_response"},
	"envoy.config.route.v3.RouteMatch":                                  {"prefix", "path", "headers"},
	"envoy.config.route.v3.HeaderMatcher":                               {"name", "exact_match", "prefix_match", "present_match", "string_match", "invert_match"},
	"envoy.type.matcher.v3.StringMatcher":                               {"exact", "prefix", "ignore_case"},
	"envoy.config.route.v3.RouteAction":                                 {"cluster", "weighted_clusters", "timeout", "retry_policy", "hash_policy"},
	"envoy.config.route.v3.WeightedCluster":                             {"clusters", "total_weight"},
	"envoy.config.route.v3.WeightedCluster.ClusterWeight":               {"name", "weight"},
	"envoy.config.route.v3.RetryPolicy":                                 {"retry_on", "num_retries", "per_try_timeout"},
	"envoy.config.route.v3.RouteAction.HashPolicy":                      {"header", "cookie", "connection_properties"},
	"envoy.config.route.v3.RouteAction.HashPolicy.Header":               {"header_name"},
	"envoy.config.route.v3.RouteAction.HashPolicy.Cookie":               {"name"},
	"envoy.config.route.v3.RouteAction.HashPolicy.ConnectionProperties": {"source_ip"},
	"envoy.config.route.v3.DirectResponseAction":                        {"status", "body"},

	// Cluster (CDS) and ClusterLoadAssignment (EDS).
	"envoy.config.cluster.v3.Cluster": {"name", "type", "eds_cluster_config", "connect_timeout", "lb_policy",
		"load_assignment", "dns_refresh_rate", "health_checks", "outlier_detection", "circuit_breakers",
		"transport_socket", "typed_extension_protocol_options", "http2_protocol_options"},
	"envoy.config.cluster.v3.Cluster.EdsClusterConfig":                          {"eds_config", "service_name"},
	"envoy.config.endpoint.v3.ClusterLoadAssignment":                            {"cluster_name", "endpoints"},
	"envoy.config.endpoint.v3.LocalityLbEndpoints":                              {"locality", "lb_endpoints"},
	"envoy.config.core.v3.Locality":                                             {"region", "zone", "sub_zone"},
	"envoy.config.endpoint.v3.LbEndpoint":                                       {"endpoint", "health_status"},
	"envoy.config.endpoint.v3.Endpoint":                                         {"address"},
	"envoy.config.core.v3.HealthCheck":                                          {"timeout", "interval", "unhealthy_threshold", "healthy_threshold", "http_health_check", "tcp_health_check"},
	"envoy.config.core.v3.HealthCheck.HttpHealthCheck":                          {"path", "expected_statuses"},
	"envoy.config.core.v3.HealthCheck.TcpHealthCheck":                           nil,
	"envoy.type.v3.Int64Range":                                                  {"start", "end"},
	"envoy.config.cluster.v3.OutlierDetection":                                  {"consecutive_5xx", "base_ejection_time", "max_ejection_percent", "split_external_local_origin_errors", "consecutive_local_origin_failure"},
	"envoy.config.cluster.v3.CircuitBreakers":                                   {"thresholds"},
	"envoy.config.cluster.v3.CircuitBreakers.Thresholds":                        {"priority", "max_connections", "max_pending_requests", "max_requests", "max_retries"},
	"envoy.extensions.upstreams.http.v3.HttpProtocolOptions":                    {"explicit_http_config", "common_http_protocol_options"},
	"envoy.extensions.upstreams.http.v3.HttpProtocolOptions.ExplicitHttpConfig": {"http_protocol_options", "http2_protocol_options"},
}

// leafMessages are value wrappers, read whole where they are allowed.
var leafMessages = map[protoreflect.FullName]bool{
	"google.protobuf.Duration":    true,
	"google.protobuf.UInt32Value": true,
	"google.protobuf.UInt64Value": true,
	"google.protobuf.BoolValue":   true,
}

var supportedSet = func() map[protoreflect.FullName]map[protoreflect.Name]bool {
	m := make(map[protoreflect.FullName]map[protoreflect.Name]bool, len(supportedFields))
	for msg, fields := range supportedFields {
		s := make(map[protoreflect.Name]bool, len(fields))
		for _, f := range fields {
			s[f] = true
		}
		m[msg] = s
	}
	return m
}()

// checkSupported walks every field set in m, into nested messages, lists,
// maps and Any payloads, and returns the path of the first one hotproxy
// does not implement ("health_checks[0].http_health_check.host"), with
// why, or "" when all are supported.
func checkSupported(m protoreflect.Message, path string) (field, why string) {
	name := m.Descriptor().FullName()
	if leafMessages[name] {
		return "", ""
	}
	if name == "google.protobuf.Any" {
		a := m.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			return path, fmt.Sprintf("type %s is not supported by hotproxy", strings.TrimPrefix(a.GetTypeUrl(), "type.googleapis.com/"))
		}
		if _, ok := supportedSet[inner.ProtoReflect().Descriptor().FullName()]; !ok {
			return path, fmt.Sprintf("type %s is not supported by hotproxy", inner.ProtoReflect().Descriptor().FullName())
		}
		return checkSupported(inner.ProtoReflect(), path)
	}
	allowed, ok := supportedSet[name]
	if !ok {
		return path, fmt.Sprintf("message %s is not supported by hotproxy", name)
	}
	// Range visits fields in an undefined order; sort them so that the
	// first refused field named is always the same one.
	var fds []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		fds = append(fds, fd)
		return true
	})
	sort.Slice(fds, func(i, j int) bool { return fds[i].Number() < fds[j].Number() })
	for _, fd := range fds {
		p := join(path, string(fd.Name()))
		if !allowed[fd.Name()] {
			return p, "is not supported by hotproxy"
		}
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				continue
			}
			var keys []string
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k.String())
				return true
			})
			sort.Strings(keys)
			for _, k := range keys {
				mv := v.Map().Get(protoreflect.ValueOfString(k).MapKey())
				if f, w := checkSupported(mv.Message(), fmt.Sprintf("%s[%q]", p, k)); f != "" {
					return f, w
				}
			}
		case fd.IsList():
			if fd.Message() == nil {
				continue
			}
			for i := 0; i < v.List().Len(); i++ {
				if f, w := checkSupported(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i)); f != "" {
					return f, w
				}
			}
		case fd.Message() != nil:
			if f, w := checkSupported(v.Message(), p); f != "" {
				return f, w
			}
		}
	}
	return "", ""
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// validatable is what protoc-gen-validate generates on every Envoy type:
// the API's own rules (required fields, ranges).
type validatable interface{ ValidateAll() error }

// checkResource refuses a resource that breaks the API's own rules or sets
// a field hotproxy does not implement, naming it.
func checkResource(kind, name string, msg proto.Message) error {
	if v, ok := msg.(validatable); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s %q: %w", kind, name, err)
		}
	}
	if f, why := checkSupported(msg.ProtoReflect(), ""); f != "" {
		return &FieldError{Kind: kind, Name: name, Field: f, Problem: why}
	}
	return nil
}

// FieldError is a resource refused for one of its fields, written the way
// `hotproxy validate` writes a key of the TOML file:
// cluster "backend": field "lb_subset_config" is not supported by hotproxy.
type FieldError struct {
	Kind    string // "listener", "route_configuration", "cluster", "cluster_load_assignment", "secret"
	Name    string // the resource's name
	Field   string // the field's path within the resource
	Problem string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s %q: %s", e.Kind, e.Name, e.Problem)
	}
	if strings.HasPrefix(e.Problem, ":") {
		return fmt.Sprintf("%s %q: field %q%s", e.Kind, e.Name, e.Field, e.Problem)
	}
	return fmt.Sprintf("%s %q: field %q %s", e.Kind, e.Name, e.Field, e.Problem)
}
