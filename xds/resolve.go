package xds

import (
	"fmt"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/hotproxy/hotproxy/config"
)

// mappedRoutes is a RouteConfiguration, mapped.
type mappedRoutes struct {
	routes []config.Route
	hash   map[string]string
}

// mapResource maps r (of type t) once; the result is kept on r.
func (m *mapper) mapResource(t TypeURL, r *resource) error {
	if r.mapped != nil {
		return nil
	}
	var err error
	switch msg := r.msg.(type) {
	case *listenerv3.Listener:
		r.mapped, err = m.listener(msg)
	case *routev3.RouteConfiguration:
		var mr mappedRoutes
		mr.routes, mr.hash, err = routeConfiguration(msg)
		r.mapped = &mr
	case *clusterv3.Cluster:
		r.mapped, err = m.cluster(msg)
	case *endpointv3.ClusterLoadAssignment:
		var eps []string
		eps, err = m.loadAssignment(msg)
		r.mapped = eps
	case *tlsv3.Secret:
		r.mapped, err = m.secret(msg)
	default:
		err = fmt.Errorf("%s: resource %q: unexpected message %T", t.Short(), r.name, r.msg)
	}
	if err != nil {
		r.mapped = nil
	}
	return err
}

// references returns the names a set of listeners and clusters needs of
// the dependent types (RDS, EDS, SDS), each sorted.
func references(listeners, clusters map[string]*resource) map[TypeURL][]string {
	seen := map[TypeURL]map[string]bool{RouteType: {}, EndpointType: {}, SecretType: {}}
	for _, r := range listeners {
		ml := r.mapped.(*mappedListener)
		if ml.rds != "" {
			seen[RouteType][ml.rds] = true
		}
		for _, s := range ml.certSDS {
			if s != "" {
				seen[SecretType][s] = true
			}
		}
	}
	for _, r := range clusters {
		mc := r.mapped.(*mappedCluster)
		if mc.eds != "" {
			seen[EndpointType][mc.eds] = true
		}
		for _, s := range []string{mc.certSDS, mc.caSDS} {
			if s != "" {
				seen[SecretType][s] = true
			}
		}
	}
	out := map[TypeURL][]string{}
	for t, names := range seen {
		for n := range names {
			out[t] = append(out[t], n)
		}
		slices.Sort(out[t])
	}
	return out
}

// resolve assembles a State from a set of mapped resources per type:
// routes into listeners, endpoints into clusters, secrets into TLS. A
// reference whose resource is missing (its fetch timed out) leaves a
// cluster without endpoints and a listener answering 404, as Envoy does
// once initial_fetch_timeout passed; a missing secret is an error, as no
// TLS can be served without it.
func resolve(set map[TypeURL]map[string]*resource) (*State, error) {
	st := &State{}
	secret := func(name string) *mappedSecret {
		if r := set[SecretType][name]; r != nil {
			return r.mapped.(*mappedSecret)
		}
		return nil
	}
	hashOf := map[string]string{} // cluster → hash_on, from the routes
	hashFrom := map[string]string{}
	addHash := func(from string, h map[string]string) error {
		for c, k := range h {
			if prev, ok := hashOf[c]; ok && prev != k {
				return fmt.Errorf("%s hashes cluster %q on %s, %s on %s: hotproxy keeps one hash key per cluster", from, c, k, hashFrom[c], prev)
			}
			hashOf[c], hashFrom[c] = k, from
		}
		return nil
	}
	for _, name := range sortedNames(set[ListenerType]) {
		ml := set[ListenerType][name].mapped.(*mappedListener)
		l := cloneListener(ml.l)
		switch {
		case ml.rds != "":
			if r := set[RouteType][ml.rds]; r != nil {
				mr := r.mapped.(*mappedRoutes)
				l.Routes = cloneRoutes(mr.routes)
				if err := addHash(fmt.Sprintf("route_configuration %q", ml.rds), mr.hash); err != nil {
					return nil, err
				}
			} else {
				l.Routes = []config.Route{{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 404, Body: "no route\n"}}}
			}
		case len(ml.hash) > 0:
			if err := addHash(fmt.Sprintf("listener %q", name), ml.hash); err != nil {
				return nil, err
			}
		}
		for i, s := range ml.certSDS {
			if s == "" {
				continue
			}
			sec := secret(s)
			if sec == nil || sec.cert == nil {
				return nil, fmt.Errorf("listener %q: secret %q: no tls_certificate has arrived by SDS", name, s)
			}
			l.TLS.Certificates[i] = *sec.cert
		}
		st.Listeners = append(st.Listeners, l)
	}
	for _, name := range sortedNames(set[ClusterType]) {
		mc := set[ClusterType][name].mapped.(*mappedCluster)
		c := cloneCluster(mc.c)
		if mc.eds != "" {
			c.Endpoints = nil
			if r := set[EndpointType][mc.eds]; r != nil {
				c.Endpoints = slices.Clone(r.mapped.([]string))
			}
		}
		if mc.certSDS != "" {
			sec := secret(mc.certSDS)
			if sec == nil || sec.cert == nil {
				return nil, fmt.Errorf("cluster %q: secret %q: no tls_certificate has arrived by SDS", name, mc.certSDS)
			}
			c.TLS.Cert, c.TLS.Key = sec.cert.Cert, sec.cert.Key
		}
		if mc.caSDS != "" {
			sec := secret(mc.caSDS)
			if sec == nil || sec.ca == "" {
				return nil, fmt.Errorf("cluster %q: secret %q: no validation_context has arrived by SDS", name, mc.caSDS)
			}
			c.TLS.CA = sec.ca
		}
		if h, ok := hashOf[name]; ok && (c.LBPolicy == config.LBRingHash || c.LBPolicy == config.LBMaglev) {
			c.HashOn = h
		}
		st.Clusters = append(st.Clusters, c)
	}
	// The defaults the TOML file would get, so that both sources give
	// the same objects.
	cfg := config.Config{Listeners: st.Listeners, Clusters: st.Clusters}
	cfg.SetDefaults()
	st.Listeners, st.Clusters = cfg.Listeners, cfg.Clusters
	return st, nil
}

func sortedNames(m map[string]*resource) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// The mapped objects are shared by every State built from them; each
// State gets copies, so that the one the main goroutine holds never
// changes.

func cloneRoutes(rs []config.Route) []config.Route {
	out := slices.Clone(rs)
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out
}

func cloneListener(l config.Listener) config.Listener {
	l.Routes = cloneRoutes(l.Routes)
	if l.TLS != nil {
		t := *l.TLS
		t.Certificates = slices.Clone(t.Certificates)
		t.CipherSuites = slices.Clone(t.CipherSuites)
		t.ALPN = slices.Clone(t.ALPN)
		l.TLS = &t
	}
	l.SNIRoutes = slices.Clone(l.SNIRoutes)
	for i := range l.SNIRoutes {
		l.SNIRoutes[i].ServerNames = slices.Clone(l.SNIRoutes[i].ServerNames)
	}
	return l
}

func cloneCluster(c config.Cluster) config.Cluster {
	c.Endpoints = slices.Clone(c.Endpoints)
	if c.HealthCheck != nil {
		h := *c.HealthCheck
		h.ExpectedStatuses = slices.Clone(h.ExpectedStatuses)
		c.HealthCheck = &h
	}
	if c.OutlierDetection != nil {
		o := *c.OutlierDetection
		c.OutlierDetection = &o
	}
	if c.CircuitBreakers != nil {
		b := *c.CircuitBreakers
		c.CircuitBreakers = &b
	}
	if c.TLS != nil {
		t := *c.TLS
		c.TLS = &t
	}
	return c
}
