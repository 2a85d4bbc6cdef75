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
		v.ps.add(key+".connect", "true needs cluster = \"NAME\": a CONNECT tunnel goes to an endpoint of a cluster (not a direct_response or weighted_clusters)")
	}
	for h := range r.Headers {
		v.headerMatch(key+"."+itemKey("headers", h, r.Headers[h].Name), &r.Headers[h])
	}
	var actions []string
	if r.Cluster != "" {
		actions = append(actions, "cluster")
	}
	if len(r.WeightedClusters) > 0 {
		actions = append(actions, "weighted_clusters")
	}
	if r.DirectResponse != nil {
		actions = append(actions, "direct_response")
	}
	switch {
	case len(actions) == 0:
		v.ps.add(key, "needs an action: cluster = \"NAME\", weighted_clusters = [{ cluster = \"A\", weight = 3 }, { cluster = \"B\", weight = 1 }] or direct_response = { status = 200, body = \"...\" }")
	case len(actions) > 1:
		if r.Cluster != "" {
			actions[0] = "cluster (" + quote(r.Cluster) + ")"
		}
		v.ps.add(key, "has both %s; keep one", strings.Join(actions, " and "))
	case r.Cluster != "":
		v.clusterRef(key+".cluster", r.Cluster)
	case len(r.WeightedClusters) > 0:
		v.weightedClusters(key+".weighted_clusters", r.WeightedClusters)
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

// weightedClusters checks a route's weighted split: every cluster named
// and known, once; the weights' own bounds are declared on the field.
func (v *validator) weightedClusters(key string, ws []WeightedCluster) {
	seen := map[string]int{}
	for i, w := range ws {
		k := fmt.Sprintf("%s[%d]", key, i)
		switch {
		case w.Cluster == "":
			v.ps.add(k+".cluster", "missing: the cluster this share of the requests goes to")
			continue
		default:
			v.clusterRef(k+".cluster", w.Cluster)
		}
		if j, ok := seen[w.Cluster]; ok {
			v.ps.add(k+".cluster", "%s: already in %s[%d]; add the weights into one entry", quote(w.Cluster), key, j)
		}
		seen[w.Cluster] = i
	}
}

// headerMatch checks one header field a route requires.
func (v *validator) headerMatch(key string, h *HeaderMatch) {
	switch {
	case h.Name == "":
		v.ps.add(key+".name", "missing: the header field to match, like name = \"x-canary\" or name = \":method\"")
	case strings.HasPrefix(h.Name, ":"):
		if h.Name != HeaderMethod {
			v.ps.add(key+".name", "%s: of the pseudo-header fields only %q can be matched (match the path with prefix or path, the host with host)", quote(h.Name), HeaderMethod)
		}
	case !isFieldName(h.Name):
		v.ps.add(key+".name", "%s: not a header field name (letters, digits and !#$%%&'*+-.^_`|~, RFC 9110 5.1)", quote(h.Name))
	}
	var tests []string
	if h.Exact != nil {
		tests = append(tests, "exact")
	}
	if h.Prefix != "" {
		tests = append(tests, "prefix")
	}
	if h.Present {
		tests = append(tests, "present")
	}
	switch {
	case len(tests) == 0:
		v.ps.add(key, "needs one test: exact = \"VALUE\", prefix = \"VALUE\" or present = true")
	case len(tests) > 1:
		v.ps.add(key, "has %s; keep one test", strings.Join(tests, " and "))
	case h.IgnoreCase && h.Present:
		v.ps.add(key+".ignore_case", "does nothing with present; remove it")
	}
}

// HeaderMethod is the pseudo-header field a route's headers may match:
// the request method, over HTTP/1.1 as over HTTP/2.
const HeaderMethod = ":method"

// isFieldName reports whether s is a token (RFC 9110 5.6.2), what a
// header field name is.
func isFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
