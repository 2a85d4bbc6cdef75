package xds

import (
	"fmt"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

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
				for _, cl := range cr.ClusterNames() {
					if prev, ok := hash[cl]; ok && prev != h {
						return nil, nil, bad(rkey+".route.hash_policy", "hashes on %s, another route on %s, for the same cluster %q: hotproxy keeps one hash key per cluster", h, prev, cl)
					}
					hash[cl] = h
				}
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
			r = r.Clone()
			r.Host = h.domain
			routes = append(routes, r)
		}
	}
	return routes, hash, nil
}

// weightedClusters maps a split: the clusters with a weight above 0 (one
// with 0 takes no request, as in Envoy), which must be at least one; a
// total_weight, if given, must be their sum (Envoy's rule).
func weightedClusters(wc *routev3.WeightedCluster) ([]config.WeightedCluster, *routeError) {
	var out []config.WeightedCluster
	var sum uint64
	for i, cw := range wc.GetClusters() {
		w := cw.GetWeight().GetValue()
		sum += uint64(w)
		if w == 0 {
			continue
		}
		if w > maxWeight {
			return nil, &routeError{fmt.Sprintf(".clusters[%d].weight", i), fmt.Sprintf("%d: hotproxy takes weights up to %d; scale the split down", w, maxWeight)}
		}
		out = append(out, config.WeightedCluster{Cluster: cw.GetName(), Weight: int(w)})
	}
	if tw := wc.GetTotalWeight(); tw != nil && uint64(tw.GetValue()) != sum {
		return nil, &routeError{".total_weight", fmt.Sprintf("%d: not the sum of the clusters' weights (%d); fix it or leave it out", tw.GetValue(), sum)}
	}
	if len(out) == 0 {
		return nil, &routeError{".clusters", "no cluster has a weight above 0: give at least one a weight"}
	}
	return out, nil
}

// maxWeight is the bound of listeners.routes.weighted_clusters.weight.
const maxWeight = 1000000

// headerMatch maps one HeaderMatcher: exact, prefix and present, by the
// deprecated fields or string_match (with ignore_case), and
// invert_match. Anything else (regex, range, suffix, contains) is
// refused by the allow-list before it gets here.
func headerMatch(hm *routev3.HeaderMatcher) (config.HeaderMatch, *routeError) {
	h := config.HeaderMatch{Name: strings.ToLower(hm.GetName()), Invert: hm.GetInvertMatch()}
	if strings.HasPrefix(h.Name, ":") && h.Name != config.HeaderMethod {
		return h, &routeError{".name", fmt.Sprintf("%q: of the pseudo-headers hotproxy matches only %q (match the path with prefix or path, the host with the virtual host's domains)", hm.GetName(), config.HeaderMethod)}
	}
	switch m := hm.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_ExactMatch:
		h.Exact = new(m.ExactMatch)
	case *routev3.HeaderMatcher_PrefixMatch:
		h.Prefix = m.PrefixMatch
	case *routev3.HeaderMatcher_PresentMatch:
		// present_match: false matches a request without the field.
		h.Present = true
		if !m.PresentMatch {
			h.Invert = !h.Invert
		}
	case *routev3.HeaderMatcher_StringMatch:
		sm := m.StringMatch
		h.IgnoreCase = sm.GetIgnoreCase()
		switch p := sm.GetMatchPattern().(type) {
		case *matcherv3.StringMatcher_Exact:
			h.Exact = new(p.Exact)
		case *matcherv3.StringMatcher_Prefix:
			h.Prefix = p.Prefix
		default:
			return h, &routeError{".string_match", "give exact or prefix (other string matches are not supported by hotproxy)"}
		}
	case nil:
		// Envoy: no specifier matches a field that is there.
		h.Present = true
	default:
		return h, &routeError{"", "give exact_match, prefix_match, present_match or string_match (other header matches are not supported by hotproxy)"}
	}
	return h, nil
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
	for i, hm := range r.GetMatch().GetHeaders() {
		h, err := headerMatch(hm)
		if err != nil {
			err.field = fmt.Sprintf(".match.headers[%d]%s", i, err.field)
			return config.Route{}, "", err
		}
		out.Headers = append(out.Headers, h)
	}
	var hashOn string
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		ra := a.Route
		switch c := ra.GetClusterSpecifier().(type) {
		case *routev3.RouteAction_Cluster:
			out.Cluster = c.Cluster
		case *routev3.RouteAction_WeightedClusters:
			ws, err := weightedClusters(c.WeightedClusters)
			if err != nil {
				err.field = ".route.weighted_clusters" + err.field
				return config.Route{}, "", err
			}
			// One cluster with all the weight is a plain cluster.
			if len(ws) == 1 {
				out.Cluster = ws[0].Cluster
			} else {
				out.WeightedClusters = ws
			}
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
