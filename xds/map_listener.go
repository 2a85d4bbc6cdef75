package xds

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"

	"github.com/hotproxy/hotproxy/config"
)

// Well-known extension names, for a filter given by name without a
// typed_config.
const (
	tlsInspectorName = "envoy.filters.listener.tls_inspector"
	routerName       = "envoy.filters.http.router"
	tlsSocketName    = "envoy.transport_sockets.tls"
)

// mapper turns Envoy resources into config's types, one resource at a
// time; references between resources (RDS, EDS, SDS) are resolved later,
// when a whole state is assembled (resolve.go).
type mapper struct {
	files *secretFiles
}

// mappedListener is a listener before its references are resolved.
type mappedListener struct {
	l config.Listener
	// rds names the route configuration of an http listener that takes
	// its routes from RDS; "" for inline routes or a tcp listener.
	rds string
	// certSDS has, per entry of l.TLS.Certificates, the SDS secret that
	// fills it, or "" for a pair given by files.
	certSDS []string
	// hash has the hash_on keys inline routes ask of their clusters.
	hash map[string]string
	// files are the secret files its inline data sources were written to.
	files []string
}

// problem is a FieldError whose Problem follows the field's name after a
// colon.
func problem(kind, name, field, format string, args ...any) *FieldError {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = ": " + msg
	}
	return &FieldError{Kind: kind, Name: name, Field: field, Problem: msg}
}

func (m *mapper) listener(lis *listenerv3.Listener) (*mappedListener, error) {
	const kind = "listener"
	name := lis.GetName()
	if err := checkResource(kind, name, lis); err != nil {
		return nil, err
	}
	bad := func(field, format string, args ...any) error { return problem(kind, name, field, format, args...) }
	out := &mappedListener{l: config.Listener{Name: name}}
	addr, err := socketAddress(lis.GetAddress().GetSocketAddress())
	if err != nil {
		return nil, bad("address.socket_address", "%v", err)
	}
	out.l.Address = addr
	for i, lf := range lis.GetListenerFilters() {
		if lf.GetTypedConfig() == nil && lf.GetName() != tlsInspectorName {
			return nil, bad(fmt.Sprintf("listener_filters[%d]", i), "%q is not supported by hotproxy (only %s, which hotproxy always runs where SNI is needed)", lf.GetName(), tlsInspectorName)
		}
	}
	chains := lis.GetFilterChains()
	if len(chains) == 0 {
		return nil, bad("filter_chains", "a listener needs one filter chain with an http_connection_manager or a tcp_proxy")
	}
	type chain struct {
		filter proto.Message // *hcmv3.HttpConnectionManager or *tcpv3.TcpProxy
		tls    *tlsv3.DownstreamTlsContext
		names  []string
	}
	var cs []chain
	for i, fc := range chains {
		key := fmt.Sprintf("filter_chains[%d]", i)
		if len(fc.GetFilters()) != 1 {
			return nil, bad(key+".filters", "hotproxy takes exactly one network filter per chain (an http_connection_manager or a tcp_proxy), not %d", len(fc.GetFilters()))
		}
		f := fc.GetFilters()[0]
		if f.GetTypedConfig() == nil {
			return nil, bad(key+".filters[0].typed_config", "missing: give the http_connection_manager or tcp_proxy its typed_config")
		}
		inner, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			return nil, bad(key+".filters[0].typed_config", "%v", err)
		}
		switch inner.(type) {
		case *hcmv3.HttpConnectionManager, *tcpv3.TcpProxy:
		default:
			return nil, bad(key+".filters[0].typed_config", "type %s is not supported by hotproxy", inner.ProtoReflect().Descriptor().FullName())
		}
		c := chain{filter: inner, names: fc.GetFilterChainMatch().GetServerNames()}
		if ts := fc.GetTransportSocket(); ts != nil {
			if ts.GetTypedConfig() == nil {
				return nil, bad(key+".transport_socket", "%q without a typed_config is not supported by hotproxy (give a DownstreamTlsContext)", ts.GetName())
			}
			t, err := ts.GetTypedConfig().UnmarshalNew()
			if err != nil {
				return nil, bad(key+".transport_socket.typed_config", "%v", err)
			}
			d, ok := t.(*tlsv3.DownstreamTlsContext)
			if !ok {
				return nil, bad(key+".transport_socket.typed_config", "type %s is not supported by hotproxy (a listener takes a DownstreamTlsContext)", t.ProtoReflect().Descriptor().FullName())
			}
			c.tls = d
		}
		cs = append(cs, c)
	}
	// The chain without server_names is the default; hotproxy has one
	// default, which goes first.
	slices.SortStableFunc(cs, func(a, b chain) int {
		switch {
		case len(a.names) == 0 && len(b.names) > 0:
			return -1
		case len(a.names) > 0 && len(b.names) == 0:
			return 1
		}
		return 0
	})
	if len(cs) > 1 && len(cs[1].names) == 0 {
		return nil, bad("filter_chains", "two filter chains without filter_chain_match.server_names: hotproxy has one default chain")
	}
	withTLS := cs[0].tls != nil
	for _, c := range cs[1:] {
		if (c.tls != nil) != withTLS {
			return nil, bad("filter_chains", "some chains terminate TLS and some do not: hotproxy terminates TLS for a whole listener, or passes it through by SNI for a whole listener")
		}
	}

	// TLS passthrough: tcp_proxy chains chosen by SNI, no TLS context.
	if !withTLS && len(cs) > 1 {
		for i, c := range cs {
			tp, ok := c.filter.(*tcpv3.TcpProxy)
			if !ok {
				return nil, bad("filter_chains", "chains chosen by server_names without TLS are only supported with a tcp_proxy (TLS passthrough by SNI)")
			}
			if i == 0 && len(c.names) == 0 {
				if err := m.tcpProxy(&out.l, tp, bad); err != nil {
					return nil, err
				}
				continue
			}
			out.l.Protocol = config.ProtocolTCP
			out.l.SNIRoutes = append(out.l.SNIRoutes, config.SNIRoute{ServerNames: slices.Clone(c.names), Cluster: tp.GetCluster()})
			if d := tp.GetIdleTimeout(); d != nil && out.l.IdleTimeout == 0 {
				out.l.IdleTimeout = config.Duration(d.AsDuration())
			}
		}
		return out, nil
	}

	// One filter for the whole listener; chains that differ only by
	// server_names add certificates chosen by SNI.
	for _, c := range cs[1:] {
		if !proto.Equal(c.filter, cs[0].filter) {
			return nil, bad("filter_chains", "chains with different filters are not supported by hotproxy: its TLS listener picks a certificate by SNI and serves one http_connection_manager or tcp_proxy")
		}
	}
	switch f := cs[0].filter.(type) {
	case *hcmv3.HttpConnectionManager:
		if err := m.httpConnectionManager(out, f, withTLS, bad); err != nil {
			return nil, err
		}
	case *tcpv3.TcpProxy:
		if err := m.tcpProxy(&out.l, f, bad); err != nil {
			return nil, err
		}
	}
	if withTLS {
		t := &config.ListenerTLS{}
		for i, c := range cs {
			key := fmt.Sprintf("filter_chains[%d].transport_socket.typed_config.common_tls_context", i)
			ctx := c.tls.GetCommonTlsContext()
			if ctx.GetValidationContext() != nil || ctx.GetValidationContextSdsSecretConfig() != nil {
				return nil, bad(key+".validation_context", "client certificates are not supported by hotproxy on a listener")
			}
			min, max, suites, err := tlsParams(ctx.GetTlsParams())
			if err != nil {
				return nil, bad(key+".tls_params", "%v", err)
			}
			if i == 0 {
				t.MinVersion, t.MaxVersion, t.CipherSuites, t.ALPN = min, max, suites, slices.Clone(ctx.GetAlpnProtocols())
			} else if min != t.MinVersion || max != t.MaxVersion || !slices.Equal(suites, t.CipherSuites) || !slices.Equal(ctx.GetAlpnProtocols(), t.ALPN) {
				return nil, bad(key, "tls_params and alpn_protocols must be the same in every chain: hotproxy has one TLS configuration per listener, with certificates picked by SNI")
			}
			for j, tc := range ctx.GetTlsCertificates() {
				p, files, err := m.certificatePair(tc)
				if err != nil {
					return nil, bad(fmt.Sprintf("%s.tls_certificates[%d]", key, j), "%v", err)
				}
				t.Certificates = append(t.Certificates, p)
				out.certSDS = append(out.certSDS, "")
				out.files = append(out.files, files...)
			}
			for j, sds := range ctx.GetTlsCertificateSdsSecretConfigs() {
				if err := adsSource(sds.GetSdsConfig()); err != nil {
					return nil, bad(fmt.Sprintf("%s.tls_certificate_sds_secret_configs[%d].sds_config", key, j), "%v", err)
				}
				t.Certificates = append(t.Certificates, config.CertificatePair{})
				out.certSDS = append(out.certSDS, sds.GetName())
			}
		}
		if len(t.Certificates) == 0 {
			return nil, bad("filter_chains[0].transport_socket", "a TLS listener needs a certificate (tls_certificates or tls_certificate_sds_secret_configs)")
		}
		if len(t.ALPN) == 0 {
			t.ALPN = nil // config's default for the protocol
		}
		out.l.TLS = t
	}
	return out, nil
}

func (m *mapper) httpConnectionManager(out *mappedListener, h *hcmv3.HttpConnectionManager, withTLS bool, bad func(string, string, ...any) error) error {
	const key = "filter_chains[0].filters[0].typed_config"
	l := &out.l
	l.Protocol = config.ProtocolHTTP
	switch h.GetCodecType() {
	case hcmv3.HttpConnectionManager_AUTO, hcmv3.HttpConnectionManager_HTTP2:
		// Without TLS, AUTO serves HTTP/2 to a client that opens with
		// its preface, as hotproxy's h2c does; with TLS, ALPN decides.
		l.HTTP2Cleartext = !withTLS
	case hcmv3.HttpConnectionManager_HTTP1:
	default:
		return bad(key+".codec_type", "%s is not supported by hotproxy (use AUTO, HTTP1 or HTTP2)", h.GetCodecType())
	}
	filters := h.GetHttpFilters()
	for i, f := range filters {
		if f.GetTypedConfig() == nil && f.GetName() != routerName {
			return bad(fmt.Sprintf("%s.http_filters[%d]", key, i), "%q is not supported by hotproxy (only %s)", f.GetName(), routerName)
		}
	}
	if len(filters) != 1 {
		return bad(key+".http_filters", "hotproxy runs exactly one HTTP filter, the router (%s); there are %d", routerName, len(filters))
	}
	if d := h.GetCommonHttpProtocolOptions().GetIdleTimeout(); d != nil {
		l.IdleTimeout = config.Duration(d.AsDuration())
	}
	if d := h.GetRequestTimeout(); d != nil {
		l.RequestTimeout = config.Duration(d.AsDuration())
	}
	if d := h.GetRequestHeadersTimeout(); d != nil {
		l.HeaderTimeout = config.Duration(d.AsDuration())
	}
	if kb := h.GetMaxRequestHeadersKb(); kb != nil {
		l.MaxHeaderBytes = int(kb.GetValue()) << 10
	}
	switch {
	case h.GetRds() != nil:
		if err := adsSource(h.GetRds().GetConfigSource()); err != nil {
			return bad(key+".rds.config_source", "%v", err)
		}
		out.rds = h.GetRds().GetRouteConfigName()
	case h.GetRouteConfig() != nil:
		routes, hash, err := routeConfiguration(h.GetRouteConfig())
		if err != nil {
			if fe, ok := err.(*FieldError); ok {
				// Name the field within the listener.
				fe.Kind, fe.Name, fe.Field = "listener", out.l.Name, join(key+".route_config", fe.Field)
			}
			return err
		}
		l.Routes, out.hash = routes, hash
	default:
		return bad(key, "an http_connection_manager needs rds or route_config")
	}
	return nil
}

func (m *mapper) tcpProxy(l *config.Listener, t *tcpv3.TcpProxy, bad func(string, string, ...any) error) error {
	l.Protocol = config.ProtocolTCP
	if t.GetCluster() == "" {
		return bad("filter_chains[0].filters[0].typed_config.cluster", "a tcp_proxy needs a cluster (weighted_clusters are not supported by hotproxy)")
	}
	l.Cluster = t.GetCluster()
	if d := t.GetIdleTimeout(); d != nil {
		l.IdleTimeout = config.Duration(d.AsDuration())
	}
	return nil
}

// socketAddress writes a SocketAddress as config writes addresses.
func socketAddress(sa *corev3.SocketAddress) (string, error) {
	if sa == nil {
		return "", fmt.Errorf("missing: give an address and a port_value")
	}
	port, ok := sa.GetPortSpecifier().(*corev3.SocketAddress_PortValue)
	if !ok {
		return "", fmt.Errorf("a port_value is required (named ports are not supported by hotproxy)")
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(port.PortValue))), nil
}

// adsSource refuses a config source other than ADS: the client has one
// stream, to the control plane it was given.
func adsSource(cs *corev3.ConfigSource) error {
	if cs == nil || cs.GetAds() == nil {
		return fmt.Errorf("only ads is supported by hotproxy (set config_source { ads: {} })")
	}
	return nil
}

// tlsParams maps TLS versions and OpenSSL cipher names onto config's.
func tlsParams(p *tlsv3.TlsParameters) (min, max string, suites []string, err error) {
	version := func(v tlsv3.TlsParameters_TlsProtocol, def string) (string, error) {
		switch v {
		case tlsv3.TlsParameters_TLS_AUTO:
			return def, nil
		case tlsv3.TlsParameters_TLSv1_2:
			return config.TLSVersion12, nil
		case tlsv3.TlsParameters_TLSv1_3:
			return config.TLSVersion13, nil
		}
		return "", fmt.Errorf("%s is not supported by hotproxy (TLSv1_2 or TLSv1_3)", v)
	}
	if min, err = version(p.GetTlsMinimumProtocolVersion(), config.DefaultTLSMinVersion); err != nil {
		return
	}
	if max, err = version(p.GetTlsMaximumProtocolVersion(), config.DefaultTLSMaxVersion); err != nil {
		return
	}
	for _, s := range p.GetCipherSuites() {
		iana, ok := opensslCiphers[s]
		if !ok {
			return "", "", nil, fmt.Errorf("cipher_suites: %q is not supported by hotproxy (Go's TLS 1.2 ECDHE suites: %s)", s, cipherNames())
		}
		suites = append(suites, iana)
	}
	return min, max, suites, nil
}

// opensslCiphers maps Envoy's (OpenSSL's) names of the TLS 1.2 suites Go
// implements with forward secrecy onto their IANA names, which config uses.
var opensslCiphers = map[string]string{
	"ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	"ECDHE-RSA-AES128-GCM-SHA256":   "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
	"ECDHE-RSA-AES256-GCM-SHA384":   "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
	"ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
	"ECDHE-RSA-CHACHA20-POLY1305":   "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}

func cipherNames() string {
	var n []string
	for k := range opensslCiphers {
		n = append(n, k)
	}
	slices.Sort(n)
	return fmt.Sprint(n)
}

// certificatePair maps a TlsCertificate onto config's pair of files.
func (m *mapper) certificatePair(tc *tlsv3.TlsCertificate) (config.CertificatePair, []string, error) {
	cert, cf, err := m.dataSource(tc.GetCertificateChain())
	if err != nil {
		return config.CertificatePair{}, nil, fmt.Errorf("certificate_chain: %w", err)
	}
	key, kf, err := m.dataSource(tc.GetPrivateKey())
	if err != nil {
		return config.CertificatePair{}, nil, fmt.Errorf("private_key: %w", err)
	}
	return config.CertificatePair{Cert: cert, Key: key}, append(cf, kf...), nil
}

// dataSource returns the path of a file holding a DataSource's bytes:
// the file it names (absolute), or one written for inline bytes; files
// lists what was written.
func (m *mapper) dataSource(ds *corev3.DataSource) (string, []string, error) {
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_Filename:
		if !filepathIsAbs(s.Filename) {
			return "", nil, fmt.Errorf("filename %q: must be an absolute path (there is no config file to be relative to)", s.Filename)
		}
		return s.Filename, nil, nil
	case *corev3.DataSource_InlineBytes:
		p, err := m.files.write(s.InlineBytes)
		return p, []string{p}, err
	case *corev3.DataSource_InlineString:
		p, err := m.files.write([]byte(s.InlineString))
		return p, []string{p}, err
	}
	return "", nil, fmt.Errorf("missing: give filename, inline_bytes or inline_string")
}
