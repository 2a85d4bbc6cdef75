package workers

import (
	"math/rand/v2"
	"strings"

	"github.com/hotproxy/hotproxy/workers/http1"
)

// requestFields is how the route matcher reads a request's header fields,
// whichever front end parsed them, without allocating: requestField
// returns the value of the n-th (from 0) field named name (lower case),
// ok false when the request has n or fewer; ":method" is the request
// method. Only routes with header matches call it.
type requestFields interface {
	requestField(name string, n int) (value string, ok bool)
}

// methodField is the name requestFields gives the request method (the
// HTTP/2 pseudo-header; config.HeaderMethod).
const methodField = ":method"

// match returns the route that the first route matching host (as in the
// Host header), path, sni (the TLS connection's server name; "" without
// TLS or SNI) and the request's fields picks, or nil: the route itself,
// or for a weighted split the route of the cluster picked.
func (ls *listenerSnap) match(host, path, sni string, fields requestFields) *route {
	if len(ls.routes) == 0 {
		return nil
	}
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.matches(host, path) && r.serverName.matches(sni) && (len(r.headers) == 0 || r.headersMatch(fields)) {
			if r.split != nil {
				return r.split.pick()
			}
			return r
		}
	}
	return nil
}

// matchConnect returns the first route that lets CONNECT through to host
// (the target's host) on a connection with sni, or nil. Paths do not apply
// to CONNECT; header matches do.
func (ls *listenerSnap) matchConnect(host, sni string, fields requestFields) *route {
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.connect && r.matchesHost(host) && r.serverName.matches(sni) && (len(r.headers) == 0 || r.headersMatch(fields)) {
			return r
		}
	}
	return nil
}

func (r *route) matches(host, path string) bool {
	if r.prefix {
		if !strings.HasPrefix(path, r.path) {
			return false
		}
	} else if path != r.path {
		return false
	}
	return r.matchesHost(host)
}

func (r *route) matchesHost(host string) bool {
	return hostPattern{kind: r.hostKin, name: r.host}.matches(host)
}

// headersMatch reports whether every header match of r holds for the
// request.
func (r *route) headersMatch(fields requestFields) bool {
	for i := range r.headers {
		if !r.headers[i].matches(fields) {
			return false
		}
	}
	return true
}

// headerMatcher is a compiled [[listeners.routes.headers]] entry.
type headerMatcher struct {
	name       string // lower case
	kind       headerTest
	value      string // exact or prefix
	ignoreCase bool
	invert     bool
}

type headerTest uint8

const (
	headerExact headerTest = iota
	headerPrefix
	headerPresent
)

// matches applies the test to the field's values joined with "," (as
// Envoy does for a field sent more than once), comparing piece by piece
// so that nothing is joined, nothing allocated. As in Envoy, an absent
// field fails exact and prefix, inverted or not.
func (h *headerMatcher) matches(fields requestFields) bool {
	v, ok := fields.requestField(h.name, 0)
	if !ok {
		return h.kind == headerPresent && h.invert
	}
	m := true
	if h.kind != headerPresent {
		m = h.joinedMatches(fields, v)
	}
	return m != h.invert
}

// joinedMatches compares want (exact, or its prefix) with v, the first
// value of the field, and the values after it, each after a ",".
func (h *headerMatcher) joinedMatches(fields requestFields, v string) bool {
	want := h.value
	for n := 1; ; n++ {
		if len(v) >= len(want) {
			if h.kind == headerPrefix {
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
		next, more := fields.requestField(h.name, n)
		if !more {
			return want == ""
		}
		if h.kind == headerPrefix && want == "" {
			return true
		}
		if want == "" || want[0] != ',' {
			return false
		}
		want, v = want[1:], next
	}
}

func (h *headerMatcher) equal(a, b string) bool {
	if h.ignoreCase {
		return http1.EqualFold(stringBytes(a), b)
	}
	return a == b
}

// clusterSplit is a route's weighted_clusters: routes[i], a copy of the
// route for one cluster, takes the picks in [upTo[i-1], upTo[i]).
type clusterSplit struct {
	total  uint64
	upTo   []uint64
	routes []*route
}

// pick returns the route of one cluster, at random in proportion to the
// weights. math/rand/v2's top-level functions draw from the runtime's
// per-thread generator: no lock, no allocation, nothing shared between
// workers, and no counter whose rhythm could line up with a client's
// (a counter would send every fourth request of a 3:1 split, and so
// perhaps every request of one client, to the same cluster).
func (s *clusterSplit) pick() *route {
	n := rand.Uint64N(s.total)
	for i, u := range s.upTo {
		if n < u {
			return s.routes[i]
		}
	}
	return s.routes[len(s.routes)-1]
}

// hostPattern is a compiled host or server name: any, exact, or a wildcard
// ("*.example.com" is kept as ".example.com"), lower case.
type hostPattern struct {
	kind hostMatch
	name string
}

// matches reports whether host matches the pattern. An exact or wildcard
// pattern never matches "" (a request without Host, a connection without
// SNI).
func (p hostPattern) matches(host string) bool {
	switch p.kind {
	case hostExact:
		return strings.EqualFold(host, p.name)
	case hostWildcard:
		return len(host) > len(p.name) && strings.EqualFold(host[len(host)-len(p.name):], p.name)
	}
	return true
}

// stripPort returns host without a trailing ":port", without the brackets
// of an IPv6 literal and without a trailing dot. It does not allocate.
func stripPort(host string) string {
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
