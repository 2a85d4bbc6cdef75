package route

import (
	"math/rand/v2"
	"strings"
	"unsafe"

	"github.com/hotproxy/hotproxy/http1"
)

// SNITable is a passthrough listener's sni_routes, in the config's order.
type SNITable []SNIRoute

// Match returns the index of the first sni_route naming sni, or -1.
func (t SNITable) Match(sni string) int {
	if sni == "" {
		return -1
	}
	for i := range t {
		for _, p := range t[i].ServerNames {
			if p.Matches(sni) {
				return i
			}
		}
	}
	return -1
}

// RequestFields is how the route matcher reads a request's header fields,
// whichever front end parsed them, without allocating: RequestField
// returns the value of the n-th (from 0) field named name (lower case),
// ok false when the request has n or fewer; ":method" is the request
// method. Only routes with header matches call it.
type RequestFields interface {
	RequestField(name string, n int) (value string, ok bool)
}

// MethodField is the name RequestFields gives the request method (the
// HTTP/2 pseudo-header; config.HeaderMethod).
const MethodField = ":method"

// Table is a listener's routes, in the order the config lists them.
type Table []*Route

// Match returns the route that the first route matching host (as in the
// Host header), path, sni (the TLS connection's server name; "" without
// TLS or SNI) and the request's fields picks, or nil: the route itself,
// or for a weighted split the route of the cluster picked.
func (t Table) Match(host, path, sni string, fields RequestFields) *Route {
	if len(t) == 0 {
		return nil
	}
	host = StripPort(host)
	for _, r := range t {
		if r.Matches(host, path) && r.ServerName.Matches(sni) && (len(r.Headers) == 0 || r.headersMatch(fields)) {
			if r.Split != nil {
				return r.Split.Pick()
			}
			return r
		}
	}
	return nil
}

// MatchConnect returns the first route that lets CONNECT through to host
// (the target's host) on a connection with sni, or nil. Paths do not apply
// to CONNECT; header matches do.
func (t Table) MatchConnect(host, sni string, fields RequestFields) *Route {
	host = StripPort(host)
	for _, r := range t {
		if r.Connect && r.MatchesHost(host) && r.ServerName.Matches(sni) && (len(r.Headers) == 0 || r.headersMatch(fields)) {
			return r
		}
	}
	return nil
}

// Matches reports whether r takes a request for host (port stripped) and
// path, leaving the server name aside.
func (r *Route) Matches(host, path string) bool {
	if r.Prefix {
		if !strings.HasPrefix(path, r.Path) {
			return false
		}
	} else if path != r.Path {
		return false
	}
	return r.MatchesHost(host)
}

// MatchesHost reports whether r's host pattern takes host (port stripped).
func (r *Route) MatchesHost(host string) bool {
	return HostPattern{Kind: r.HostKind, Name: r.Host}.Matches(host)
}

// headersMatch reports whether every header match of r holds for the
// request.
func (r *Route) headersMatch(fields RequestFields) bool {
	for i := range r.Headers {
		if !r.Headers[i].matches(fields) {
			return false
		}
	}
	return true
}

// HeaderMatcher is a compiled [[listeners.routes.headers]] entry.
type HeaderMatcher struct {
	Name       string // lower case
	Kind       HeaderTest
	Value      string // exact or prefix
	IgnoreCase bool
	Invert     bool
}

// HeaderTest is what a HeaderMatcher asks of a field's value.
type HeaderTest uint8

const (
	HeaderExact HeaderTest = iota
	HeaderPrefix
	HeaderPresent
)

// matches applies the test to the field's values joined with "," (as
// Envoy does for a field sent more than once), comparing piece by piece
// so that nothing is joined, nothing allocated. As in Envoy, an absent
// field fails exact and prefix, inverted or not.
func (h *HeaderMatcher) matches(fields RequestFields) bool {
	v, ok := fields.RequestField(h.Name, 0)
	if !ok {
		return h.Kind == HeaderPresent && h.Invert
	}
	m := true
	if h.Kind != HeaderPresent {
		m = h.joinedMatches(fields, v)
	}
	return m != h.Invert
}

// joinedMatches compares want (exact, or its prefix) with v, the first
// value of the field, and the values after it, each after a ",".
func (h *HeaderMatcher) joinedMatches(fields RequestFields, v string) bool {
	want := h.Value
	for n := 1; ; n++ {
		if len(v) >= len(want) {
			if h.Kind == HeaderPrefix {
				return h.equal(v[:len(want)], want)
			}
			if len(v) > len(want) || !h.equal(v, want) {
				return false
			}
			want = ""
		} else {
			if !h.equal(v, want[:len(v)]) {
				return false
			}
			want = want[len(v):]
		}
		next, more := fields.RequestField(h.Name, n)
		if !more {
			return want == ""
		}
		if h.Kind == HeaderPrefix && want == "" {
			return true
		}
		if want == "" || want[0] != ',' {
			return false
		}
		want, v = want[1:], next
	}
}

func (h *HeaderMatcher) equal(a, b string) bool {
	if h.IgnoreCase {
		return http1.EqualFold(stringBytes(a), b)
	}
	return a == b
}

// ClusterSplit is a route's weighted_clusters: routes[i], a copy of the
// route for one cluster, takes the picks in [upTo[i-1], upTo[i]).
type ClusterSplit struct {
	Total  uint64
	UpTo   []uint64
	Routes []*Route
}

// Pick returns the route of one cluster, at random in proportion to the
// weights. math/rand/v2's top-level functions draw from the runtime's
// per-thread generator: no lock, no allocation, nothing shared between
// workers, and no counter whose rhythm could line up with a client's
// (a counter would send every fourth request of a 3:1 split, and so
// perhaps every request of one client, to the same cluster).
func (s *ClusterSplit) Pick() *Route {
	n := rand.Uint64N(s.Total)
	for i, u := range s.UpTo {
		if n < u {
			return s.Routes[i]
		}
	}
	return s.Routes[len(s.Routes)-1]
}

// HostPattern is a compiled host or server name: any, exact, or a wildcard
// ("*.example.com" is kept as ".example.com"), lower case.
type HostPattern struct {
	Kind HostMatch
	Name string
}

// Matches reports whether host matches the pattern. An exact or wildcard
// pattern never matches "" (a request without Host, a connection without
// SNI).
func (p HostPattern) Matches(host string) bool {
	switch p.Kind {
	case HostExact:
		return strings.EqualFold(host, p.Name)
	case HostWildcard:
		return len(host) > len(p.Name) && strings.EqualFold(host[len(host)-len(p.Name):], p.Name)
	}
	return true
}

// StripPort returns host without a trailing ":port", without the brackets
// of an IPv6 literal and without a trailing dot. It does not allocate.
func StripPort(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host[i:], ']') < 0 {
		host = host[:i]
	}
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if len(host) > 1 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	return host
}

// stringBytes views s as bytes without copying, for reads that do not
// keep it; the bytes must never be written.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
