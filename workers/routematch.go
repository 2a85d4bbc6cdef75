package workers

import "strings"

// match returns the first route that matches host (as in the Host header),
// path and sni (the TLS connection's server name; "" without TLS or SNI),
// or nil.
func (ls *listenerSnap) match(host, path, sni string) *route {
	if len(ls.routes) == 0 {
		return nil
	}
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.matches(host, path) && r.serverName.matches(sni) {
			return r
		}
	}
	return nil
}

// matchConnect returns the first route that lets CONNECT through to host
// (the target's host) on a connection with sni, or nil. Paths do not apply
// to CONNECT.
func (ls *listenerSnap) matchConnect(host, sni string) *route {
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.connect && r.matchesHost(host) && r.serverName.matches(sni) {
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
