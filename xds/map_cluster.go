package xds

import (
	"fmt"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/hotproxy/hotproxy/config"
)

// Envoy's defaults where they differ from hotproxy's, applied when the
// Envoy field is left out, so that a cluster behaves as its control plane
// expects.
const (
	envoyMaxEjectionPercent            = 10
	envoyConsecutiveLocalOriginFailure = 5
)

const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// mappedCluster is a cluster before its references are resolved.
type mappedCluster struct {
	c config.Cluster
	// eds names the ClusterLoadAssignment of an EDS cluster; "" for
	// STATIC and STRICT_DNS, whose endpoints are in c.
	eds string
	// certSDS and caSDS name the SDS secrets of its upstream TLS.
	certSDS, caSDS string
	files          []string
}

func (m *mapper) cluster(cl *clusterv3.Cluster) (*mappedCluster, error) {
	const kind = "cluster"
	name := cl.GetName()
	if err := checkResource(kind, name, cl); err != nil {
		return nil, err
	}
	bad := func(field, format string, args ...any) error { return problem(kind, name, field, format, args...) }
	out := &mappedCluster{c: config.Cluster{Name: name}}
	c := &out.c
	switch cl.GetType() {
	case clusterv3.Cluster_EDS:
		if err := adsSource(cl.GetEdsClusterConfig().GetEdsConfig()); err != nil {
			return nil, bad("eds_cluster_config.eds_config", "%v", err)
		}
		out.eds = cl.GetEdsClusterConfig().GetServiceName()
		if out.eds == "" {
			out.eds = name
		}
		if cl.GetLoadAssignment() != nil {
			return nil, bad("load_assignment", "an EDS cluster takes its endpoints from EDS; remove load_assignment")
		}
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS:
		eps, err := endpoints(cl.GetLoadAssignment())
		if err != nil {
			return nil, bad("load_assignment"+err.field, "%s", err.msg)
		}
		c.Endpoints = eps
	default:
		return nil, bad("type", "%s is not supported by hotproxy (use STATIC, STRICT_DNS or EDS)", cl.GetType())
	}
	switch cl.GetLbPolicy() {
	case clusterv3.Cluster_ROUND_ROBIN:
		c.LBPolicy = config.LBRoundRobin
	case clusterv3.Cluster_LEAST_REQUEST:
		c.LBPolicy = config.LBLeastRequest
	case clusterv3.Cluster_RANDOM:
		c.LBPolicy = config.LBRandom
	case clusterv3.Cluster_RING_HASH:
		c.LBPolicy = config.LBRingHash
	case clusterv3.Cluster_MAGLEV:
		c.LBPolicy = config.LBMaglev
	default:
		return nil, bad("lb_policy", "%s is not supported by hotproxy (use ROUND_ROBIN, LEAST_REQUEST, RANDOM, RING_HASH or MAGLEV)", cl.GetLbPolicy())
	}
	if d := cl.GetConnectTimeout(); d != nil {
		c.ConnectTimeout = config.Duration(d.AsDuration())
	}
	if d := cl.GetDnsRefreshRate(); d != nil {
		c.DNSRefresh = config.Duration(d.AsDuration())
	}
	switch hcs := cl.GetHealthChecks(); len(hcs) {
	case 0:
	case 1:
		hc, err := healthCheck(hcs[0])
		if err != nil {
			return nil, bad("health_checks[0]"+err.field, "%s", err.msg)
		}
		c.HealthCheck = hc
	default:
		return nil, bad("health_checks", "%d health checks: hotproxy runs one per cluster", len(hcs))
	}
	if od := cl.GetOutlierDetection(); od != nil {
		c.OutlierDetection = outlierDetection(od)
	}
	if cb := cl.GetCircuitBreakers(); cb != nil {
		switch th := cb.GetThresholds(); len(th) {
		case 0:
		case 1:
			if th[0].GetPriority() != corev3.RoutingPriority_DEFAULT {
				return nil, bad("circuit_breakers.thresholds[0].priority", "%s is not supported by hotproxy (routes have no priority; use DEFAULT)", th[0].GetPriority())
			}
			c.CircuitBreakers = circuitBreakers(th[0])
		default:
			return nil, bad("circuit_breakers.thresholds", "%d thresholds: hotproxy has one set, for the DEFAULT priority", len(th))
		}
	}
	if cl.GetHttp2ProtocolOptions() != nil {
		c.HTTP2 = true
	}
	for k, opt := range cl.GetTypedExtensionProtocolOptions() {
		key := fmt.Sprintf("typed_extension_protocol_options[%q]", k)
		if k != httpProtocolOptionsKey {
			return nil, bad(key, "is not supported by hotproxy (only %s)", httpProtocolOptionsKey)
		}
		inner, err := opt.UnmarshalNew()
		if err != nil {
			return nil, bad(key, "%v", err)
		}
		hpo, ok := inner.(*httpv3.HttpProtocolOptions)
		if !ok {
			return nil, bad(key, "type %s is not supported by hotproxy", inner.ProtoReflect().Descriptor().FullName())
		}
		switch p := hpo.GetUpstreamProtocolOptions().(type) {
		case nil:
		case *httpv3.HttpProtocolOptions_ExplicitHttpConfig_:
			c.HTTP2 = p.ExplicitHttpConfig.GetHttp2ProtocolOptions() != nil
		default:
			return nil, bad(key, "only explicit_http_config is supported by hotproxy")
		}
		if d := hpo.GetCommonHttpProtocolOptions().GetIdleTimeout(); d != nil {
			c.IdleTimeout = config.Duration(d.AsDuration())
		}
	}
	if ts := cl.GetTransportSocket(); ts != nil {
		if err := m.upstreamTLS(out, ts); err != nil {
			if re, ok := err.(*routeError); ok {
				return nil, bad("transport_socket"+re.field, "%s", re.msg)
			}
			return nil, err
		}
	}
	return out, nil
}

func (m *mapper) upstreamTLS(out *mappedCluster, ts *corev3.TransportSocket) error {
	bad := func(field, format string, args ...any) error { return &routeError{field, fmt.Sprintf(format, args...)} }
	if ts.GetTypedConfig() == nil {
		return bad("", "%q without a typed_config is not supported by hotproxy (give an UpstreamTlsContext)", ts.GetName())
	}
	inner, err := ts.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return bad(".typed_config", "%v", err)
	}
	u, ok := inner.(*tlsv3.UpstreamTlsContext)
	if !ok {
		return bad(".typed_config", "type %s is not supported by hotproxy (a cluster takes an UpstreamTlsContext)", inner.ProtoReflect().Descriptor().FullName())
	}
	const key = ".typed_config.common_tls_context"
	t := &config.ClusterTLS{ServerName: u.GetSni()}
	ctx := u.GetCommonTlsContext()
	min, max, suites, err := tlsParams(ctx.GetTlsParams())
	if err != nil {
		return bad(key+".tls_params", "%v", err)
	}
	if max != config.DefaultTLSMaxVersion || len(suites) > 0 {
		return bad(key+".tls_params", "only tls_minimum_protocol_version is supported by hotproxy upstream")
	}
	t.MinVersion = min
	for _, p := range ctx.GetAlpnProtocols() {
		switch p {
		case config.ALPNHTTP2:
			out.c.HTTP2 = true
		case config.ALPNHTTP11:
		default:
			return bad(key+".alpn_protocols", "%q is not supported by hotproxy upstream (h2 or http/1.1)", p)
		}
	}
	switch certs, sds := ctx.GetTlsCertificates(), ctx.GetTlsCertificateSdsSecretConfigs(); {
	case len(certs)+len(sds) > 1:
		return bad(key, "one client certificate at most (tls_certificates or tls_certificate_sds_secret_configs)")
	case len(certs) == 1:
		p, files, err := m.certificatePair(certs[0])
		if err != nil {
			return bad(key+".tls_certificates[0]", "%v", err)
		}
		t.Cert, t.Key = p.Cert, p.Key
		out.files = append(out.files, files...)
	case len(sds) == 1:
		if err := adsSource(sds[0].GetSdsConfig()); err != nil {
			return bad(key+".tls_certificate_sds_secret_configs[0].sds_config", "%v", err)
		}
		out.certSDS = sds[0].GetName()
	}
	switch vc := ctx.GetValidationContextType().(type) {
	case nil:
		// Envoy would not verify the upstream at all; hotproxy
		// verifies against the system's pool, the safe reading.
	case *tlsv3.CommonTlsContext_ValidationContext:
		if ca := vc.ValidationContext.GetTrustedCa(); ca != nil {
			p, files, err := m.dataSource(ca)
			if err != nil {
				return bad(key+".validation_context.trusted_ca", "%v", err)
			}
			t.CA = p
			out.files = append(out.files, files...)
		}
	case *tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig:
		if err := adsSource(vc.ValidationContextSdsSecretConfig.GetSdsConfig()); err != nil {
			return bad(key+".validation_context_sds_secret_config.sds_config", "%v", err)
		}
		out.caSDS = vc.ValidationContextSdsSecretConfig.GetName()
	}
	out.c.TLS = t
	return nil
}

func (e *routeError) Error() string { return e.msg }

// endpoints maps a ClusterLoadAssignment's endpoints onto "host:port"
// strings. Endpoints the control plane marks unhealthy, draining or
// timed out are left out, as Envoy routes nothing to them.
func endpoints(cla *endpointv3.ClusterLoadAssignment) ([]string, *routeError) {
	var out []string
	for i, lle := range cla.GetEndpoints() {
		for j, le := range lle.GetLbEndpoints() {
			key := fmt.Sprintf(".endpoints[%d].lb_endpoints[%d]", i, j)
			switch le.GetHealthStatus() {
			case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_DRAINING, corev3.HealthStatus_TIMEOUT:
				continue
			}
			ep := le.GetEndpoint()
			if ep == nil {
				return nil, &routeError{key, "give an endpoint (named endpoints are not supported by hotproxy)"}
			}
			a, err := socketAddress(ep.GetAddress().GetSocketAddress())
			if err != nil {
				return nil, &routeError{key + ".endpoint.address.socket_address", err.Error()}
			}
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func (m *mapper) loadAssignment(cla *endpointv3.ClusterLoadAssignment) ([]string, error) {
	const kind = "cluster_load_assignment"
	if err := checkResource(kind, cla.GetClusterName(), cla); err != nil {
		return nil, err
	}
	eps, err := endpoints(cla)
	if err != nil {
		return nil, problem(kind, cla.GetClusterName(), err.field[1:], "%s", err.msg)
	}
	return eps, nil
}

func healthCheck(hc *corev3.HealthCheck) (*config.HealthCheck, *routeError) {
	out := &config.HealthCheck{
		Interval:           config.Duration(hc.GetInterval().AsDuration()),
		Timeout:            config.Duration(hc.GetTimeout().AsDuration()),
		UnhealthyThreshold: int(hc.GetUnhealthyThreshold().GetValue()),
		HealthyThreshold:   int(hc.GetHealthyThreshold().GetValue()),
	}
	switch k := hc.GetHealthChecker().(type) {
	case *corev3.HealthCheck_TcpHealthCheck_:
	case *corev3.HealthCheck_HttpHealthCheck_:
		out.Path = k.HttpHealthCheck.GetPath()
		for i, r := range k.HttpHealthCheck.GetExpectedStatuses() {
			if r.GetStart() < 100 || r.GetEnd() > 600 || r.GetEnd() <= r.GetStart() {
				return nil, &routeError{fmt.Sprintf(".http_health_check.expected_statuses[%d]", i), fmt.Sprintf("[%d, %d): must be a range of HTTP statuses within [100, 600)", r.GetStart(), r.GetEnd())}
			}
			for s := r.GetStart(); s < r.GetEnd(); s++ {
				out.ExpectedStatuses = append(out.ExpectedStatuses, int(s))
			}
		}
		if len(out.ExpectedStatuses) == 0 {
			out.ExpectedStatuses = []int{config.DefaultExpectedStatus}
		}
	default:
		return nil, &routeError{"", "give http_health_check or tcp_health_check (other checkers are not supported by hotproxy)"}
	}
	return out, nil
}

func outlierDetection(od *clusterv3.OutlierDetection) *config.OutlierDetection {
	out := &config.OutlierDetection{}
	five := config.DefaultConsecutive5xx
	if v := od.GetConsecutive_5Xx(); v != nil {
		five = int(v.GetValue())
	}
	out.Consecutive5xx = new(five)
	// Without split_external_local_origin_errors, Envoy counts a failed
	// connect as a 5xx; with it, consecutive_local_origin_failure counts
	// them apart, as hotproxy's consecutive_connect_failure does.
	connect := five
	if od.GetSplitExternalLocalOriginErrors() {
		connect = envoyConsecutiveLocalOriginFailure
		if v := od.GetConsecutiveLocalOriginFailure(); v != nil {
			connect = int(v.GetValue())
		}
	}
	out.ConsecutiveConnectFailure = new(connect)
	if d := od.GetBaseEjectionTime(); d != nil {
		out.BaseEjectionTime = config.Duration(d.AsDuration())
	}
	pct := envoyMaxEjectionPercent
	if v := od.GetMaxEjectionPercent(); v != nil {
		pct = int(v.GetValue())
	}
	out.MaxEjectionPercent = new(pct)
	return out
}

func circuitBreakers(th *clusterv3.CircuitBreakers_Thresholds) *config.CircuitBreakers {
	out := &config.CircuitBreakers{}
	if v := th.GetMaxConnections(); v != nil {
		out.MaxConnections = int(v.GetValue())
	}
	if v := th.GetMaxPendingRequests(); v != nil {
		out.MaxPendingRequests = int(v.GetValue())
	}
	if v := th.GetMaxRequests(); v != nil {
		out.MaxRequests = int(v.GetValue())
	}
	if v := th.GetMaxRetries(); v != nil {
		out.MaxRetries = new(int(v.GetValue()))
	}
	return out
}

// mappedSecret is a Secret's material, in files.
type mappedSecret struct {
	cert  *config.CertificatePair // tls_certificate
	ca    string                  // validation_context.trusted_ca
	files []string
}

func (m *mapper) secret(s *tlsv3.Secret) (*mappedSecret, error) {
	const kind = "secret"
	name := s.GetName()
	if err := checkResource(kind, name, s); err != nil {
		return nil, err
	}
	out := &mappedSecret{}
	switch t := s.GetType().(type) {
	case *tlsv3.Secret_TlsCertificate:
		p, files, err := m.certificatePair(t.TlsCertificate)
		if err != nil {
			return nil, problem(kind, name, "tls_certificate", "%v", err)
		}
		out.cert, out.files = &p, files
	case *tlsv3.Secret_ValidationContext:
		p, files, err := m.dataSource(t.ValidationContext.GetTrustedCa())
		if err != nil {
			return nil, problem(kind, name, "validation_context.trusted_ca", "%v", err)
		}
		out.ca, out.files = p, files
	default:
		return nil, problem(kind, name, "", "give tls_certificate or validation_context (other secrets are not supported by hotproxy)")
	}
	return out, nil
}
