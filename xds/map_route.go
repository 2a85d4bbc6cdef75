package xds

import (
	"fmt"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/hotproxy/hotproxy/config"
)

// Envoy's retry_on conditions that hotproxy implements, under the same
// names.
var supportedRetryOn = config.RetryConditions

// routeConfiguration maps a RouteConfiguration onto hotproxy's flat,
// first-match list. Envoy first picks one virtual host by the most
// specific domain (exact, then the longest "*.suffix", then "*"), then
// the first route of that host that matches, and answers 404 when none
// does; hotproxy tries routes in order. So the routes are laid out host
// by host, most specific domain first, each host's routes under each of
// its domains, and a host that does not end with a route taking every
// path ends with a 404 of its own, so that a request for it never falls
// through to another host. hash are the hash_on keys the routes' hash
// policies ask of their clusters.
func routeConfiguration(rc *routev3.RouteConfiguration) (routes []config.Route, hash map[string]string, err error) {
	const kind = "route_configuration"
	name := rc.GetName()
	if err := checkResource(kind, name, rc); err != nil {
		return nil, nil, err
	}
	bad := func(field, format string, args ...any) error { return problem(kind, name, field, format, args...) }
	type hostRoutes struct {
		domain string
		routes []config.Route
	}
	var hosts []hostRoutes
	hash = map[string]string{}
	for i, vh := range rc.GetVirtualHosts() {
		vkey := fmt.Sprintf("virtual_hosts[%d]", i)
		var rs []config.Route
		catchAll := false
		for j, r := range vh.GetRoutes() {
			rkey := fmt.Sprintf("%s.routes[%d]", vkey, j)
			cr, h, err := route(r)
			if err != nil {
				return nil, nil, bad(rkey+err.field, "%s", err.msg)
			}
			if h != "" {
				if prev, ok := hash[cr.Cluster]; ok && prev != h {
					return nil, nil, bad(rkey+".route.hash_policy", "hashes on %s, another route on %s, for the same cluster %q: hotproxy keeps one hash key per cluster", h, prev, cr.Cluster)
				}
				hash[cr.Cluster] = h
			}
			if cr.Prefix == "/" {
				catchAll = true
			}
			rs = append(rs, cr)
		}
		if !catchAll {
			rs = append(rs, config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 404, Body: "no route\n"}})
		}
		for j, d := range vh.GetDomains() {
			switch {
			case d == "*":
				d = ""
			case strings.HasSuffix(d, "*"):
				return nil, nil, bad(fmt.Sprintf("%s.domains[%d]", vkey, j), "%q: prefix wildcards are not supported by hotproxy (exact names, \"*.example.com\" or \"*\")", d)
			case strings.Contains(d[1:], "*"):
				return nil, nil, bad(fmt.Sprintf("%s.domains[%d]", vkey, j), "%q: a wildcard is only supported at the start (\"*.example.com\")", d)
			}
			hosts = append(hosts, hostRoutes{domain: d, routes: rs})
		}
	}
	// Most specific domain first: exact names, then suffix wildcards
	// longest first, then the catch-all "*".
	rank := func(d string) (int, int) {
		switch {
		case d == "":
			return 2, 0
		case strings.HasPrefix(d, "*"):
			return 1, -len(d)
		}
		return 0, 0
	}
	slices.SortStableFunc(hosts, func(a, b hostRoutes) int {
		ra, la := rank(a.domain)
		rb, lb := rank(b.domain)
		if ra != rb {
			return ra - rb
		}
		return la - lb
	})
	total := 0
	for _, h := range hosts {
		total += len(h.routes)
	}
	if total > maxRoutes {
		return nil, nil, bad("virtual_hosts", "%d routes once every domain has its own (hotproxy takes at most %d): list fewer domains per virtual host, or fewer routes", total, maxRoutes)
	}
	for _, h := range hosts {
		for _, r := range h.routes {
			r.Host = h.domain
			if r.NumRetries != nil {
				r.NumRetries = new(*r.NumRetries)
			}
			r.RetryOn = slices.Clone(r.RetryOn)
			if r.DirectResponse != nil {
				dr := *r.DirectResponse
				r.DirectResponse = &dr
			}
			routes = append(routes, r)
		}
	}
	return routes, hash, nil
}

// maxRoutes bounds the routes a route configuration becomes (its routes
// repeated for every domain of their virtual host), so that a control
// plane's few bytes cannot become a list that fills the memory.
const maxRoutes = 100000

type routeError struct{ field, msg string }

// route maps one route; the hash key its action hashes on, if any.
func route(r *routev3.Route) (config.Route, string, *routeError) {
	var out config.Route
	bad := func(field, format string, args ...any) (config.Route, string, *routeError) {
		return config.Route{}, "", &routeError{field, fmt.Sprintf(format, args...)}
	}
	switch m := r.GetMatch().GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		out.Prefix = m.Prefix
		if out.Prefix == "" {
			out.Prefix = "/"
		}
	case *routev3.RouteMatch_Path:
		out.Path = m.Path
	default:
		return bad(".match", "give prefix or path (other matches are not supported by hotproxy)")
	}
	var hashOn string
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		ra := a.Route
		switch c := ra.GetClusterSpecifier().(type) {
		case *routev3.RouteAction_Cluster:
			out.Cluster = c.Cluster
		case *routev3.RouteAction_WeightedClusters:
			// One cluster with all the weight is a plain cluster;
			// splitting traffic is not implemented.
			var with []string
			for _, cw := range c.WeightedClusters.GetClusters() {
				if cw.GetWeight().GetValue() > 0 {
					with = append(with, cw.GetName())
				}
			}
			if len(with) != 1 {
				return bad(".route.weighted_clusters", "splitting traffic between %d clusters is not supported by hotproxy (one cluster with all the weight is)", len(with))
			}
			out.Cluster = with[0]
		default:
			return bad(".route", "give cluster or weighted_clusters")
		}
		if t := ra.GetTimeout(); t != nil {
			if t.AsDuration() == 0 {
				return bad(".route.timeout", "0 (no timeout) is not supported by hotproxy: give a duration up to 24h")
			}
			out.Timeout = config.Duration(t.AsDuration())
		}
		if rp := ra.GetRetryPolicy(); rp != nil {
			for _, c := range strings.Split(rp.GetRetryOn(), ",") {
				c = strings.TrimSpace(c)
				if c == "" {
					continue
				}
				if !slices.Contains(supportedRetryOn, c) {
					return bad(".route.retry_policy.retry_on", "%q is not supported by hotproxy (use %s)", c, strings.Join(supportedRetryOn, ", "))
				}
				out.RetryOn = append(out.RetryOn, c)
			}
			if n := rp.GetNumRetries(); n != nil {
				out.NumRetries = new(int(n.GetValue()))
			}
			if d := rp.GetPerTryTimeout(); d != nil {
				out.PerTryTimeout = config.Duration(d.AsDuration())
			}
		}
		for i, hp := range ra.GetHashPolicy() {
			var h string
			switch p := hp.GetPolicySpecifier().(type) {
			case *routev3.RouteAction_HashPolicy_Header_:
				h = config.HashOnHeaderPrefix + strings.ToLower(p.Header.GetHeaderName())
			case *routev3.RouteAction_HashPolicy_Cookie_:
				h = config.HashOnCookiePrefix + p.Cookie.GetName()
			case *routev3.RouteAction_HashPolicy_ConnectionProperties_:
				if !p.ConnectionProperties.GetSourceIp() {
					return bad(fmt.Sprintf(".route.hash_policy[%d].connection_properties.source_ip", i), "false hashes on nothing: set it true or remove the policy")
				}
				h = config.HashOnSourceIP
			}
			if hashOn != "" && h != hashOn {
				return bad(fmt.Sprintf(".route.hash_policy[%d]", i), "a second hash policy is not supported by hotproxy (one key per cluster)")
			}
			hashOn = h
		}
	case *routev3.Route_DirectResponse:
		dr := a.DirectResponse
		body := ""
		if b := dr.GetBody(); b != nil {
			if b.GetFilename() != "" {
				return bad(".direct_response.body.filename", "is not supported by hotproxy (give inline_string or inline_bytes)")
			}
			body = b.GetInlineString() + string(b.GetInlineBytes())
		}
		out.DirectResponse = &config.DirectResponse{Status: int(dr.GetStatus()), Body: body}
	default:
		return bad("", "give route or direct_response (other actions, like redirect, are not supported by hotproxy)")
	}
	return out, hashOn, nil
}
