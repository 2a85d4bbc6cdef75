package config

import (
	"fmt"
	"mime"
	"slices"
	"strings"
)

func (v *validator) listeners() {
	v.addrs = map[string]string{}
	names := map[string]string{}
	for i := range v.c.Listeners {
		l := &v.c.Listeners[i]
		key := itemKey("listeners", i, l.Name)
		v.name(key, "listener", l.Name, names)

		if msg := checkAddress(l.Address, true, 0); msg != "" {
			v.ps.add(key+".address", "%s", msg)
		} else if n := normAddress(l.Address); n != "" {
			if other, ok := v.addrs[n]; ok {
				v.ps.add(key+".address", "%s: %s listens there already; give each listener its own address", quote(l.Address), other)
			} else {
				v.addrs[n] = key
			}
		}

		switch l.Protocol {
		case ProtocolTCP:
			v.tcpListener(key, l)
		case ProtocolHTTP:
			v.httpListener(key, l)
		case "":
			v.ps.add(key+".protocol", "missing (use %s)", orList(protocols))
		default:
			v.ps.add(key+".protocol", "%s: unknown protocol (use %s)", quote(l.Protocol), orList(protocols))
		}
		v.listenerTLS(key, l)
		v.sniRoutes(key, l)
		if !slices.Contains(balances, l.Balance) {
			v.ps.add(key+".balance", "%s: unknown balance (use %s; default %s)", quote(l.Balance), orList(balances), quote(DefaultBalance))
		}
	}
}

func (v *validator) tcpListener(key string, l *Listener) {
	if l.Cluster == "" {
		if len(l.SNIRoutes) == 0 {
			v.ps.add(key+".cluster", "missing: a tcp listener needs the cluster its connections go to (or sni_routes)")
		}
	} else {
		v.clusterRef(key+".cluster", l.Cluster)
	}
	if len(l.Routes) > 0 {
		v.ps.add(key+".routes", "a tcp listener has no routes (routes are for protocol = %q); remove them, or make it an http listener", ProtocolHTTP)
	}
	// Keys of http listeners only (only:"http") are refused by the bounds walk.
}

func (v *validator) httpListener(key string, l *Listener) {
	if l.Cluster != "" {
		v.ps.add(key+".cluster", "%s: an http listener picks clusters in its routes; remove cluster here and add a route like { prefix = \"/\", cluster = %s }", quote(l.Cluster), quote(l.Cluster))
	}
	if len(l.Routes) == 0 {
		v.ps.add(key+".routes", "an http listener needs at least one route; add a [[listeners.routes]] with prefix = \"/\"")
	}
	for j := range l.Routes {
		v.route(fmt.Sprintf("%s.routes[%d]", key, j), &l.Routes[j])
		v.retries(fmt.Sprintf("%s.routes[%d]", key, j), &l.Routes[j], l.RequestTimeout)
	}
	for j := range l.AccessLog {
		v.accessLog(fmt.Sprintf("%s.access_log[%d]", key, j), &l.AccessLog[j])
	}
}

func (v *validator) route(key string, r *Route) {
	switch {
	case r.Prefix == "" && r.Path == "":
		v.ps.add(key, "needs prefix (match a path prefix) or path (match a path exactly)")
	case r.Prefix != "" && r.Path != "":
		v.ps.add(key, "has both prefix (%s) and path (%s); keep one", quote(r.Prefix), quote(r.Path))
	case r.Prefix != "" && !strings.HasPrefix(r.Prefix, "/"):
		v.ps.add(key+".prefix", "%s: must start with \"/\"", quote(r.Prefix))
	case r.Path != "" && !strings.HasPrefix(r.Path, "/"):
		v.ps.add(key+".path", "%s: must start with \"/\"", quote(r.Path))
	}
	if r.Host != "" {
		if msg := checkRouteHost(r.Host); msg != "" {
			v.ps.add(key+".host", "%s: %s", quote(r.Host), msg)
		}
	}
	if r.ServerName != "" {
		if msg := checkServerName(r.ServerName); msg != "" {
			v.ps.add(key+".server_name", "%s: %s", quote(r.ServerName), msg)
		}
	}
	if r.Connect && r.Cluster == "" {
		v.ps.add(key+".connect", "true needs cluster = \"NAME\": a CONNECT tunnel goes to an endpoint of a cluster")
	}
	switch {
	case r.Cluster == "" && r.DirectResponse == nil:
		v.ps.add(key, "needs an action: cluster = \"NAME\" or direct_response = { status = 200, body = \"...\" }")
	case r.Cluster != "" && r.DirectResponse != nil:
		v.ps.add(key, "has both cluster (%s) and direct_response; keep one", quote(r.Cluster))
	case r.Cluster != "":
		v.clusterRef(key+".cluster", r.Cluster)
	default:
		dr := r.DirectResponse
		if v.inBounds(key+".direct_response.status") && (dr.Status == 204 || dr.Status == 304) && dr.Body != "" {
			v.ps.add(key+".direct_response.body", "%s: a %d response has no body; remove body, or choose another status", quote(dr.Body), dr.Status)
		}
		if dr.ContentType != "" {
			if _, _, err := mime.ParseMediaType(dr.ContentType); err != nil {
				v.ps.add(key+".direct_response.content_type", "%s: not a media type (write it like \"text/plain; charset=utf-8\")", quote(dr.ContentType))
			}
		}
	}
}
