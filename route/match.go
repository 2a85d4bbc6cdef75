package route

import "strings"

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

// Table is a listener's routes, in the order the config lists them.
type Table []*Route

// Match returns the first route that matches host (as in the Host header),
// path and sni (the TLS connection's server name; "" without TLS or SNI),
// or nil.
func (t Table) Match(host, path, sni string) *Route {
	if len(t) == 0 {
		return nil
	}
	host = StripPort(host)
	for _, r := range t {
		if r.Matches(host, path) && r.ServerName.Matches(sni) {
			return r
		}
	}
	return nil
}

// MatchConnect returns the first route that lets CONNECT through to host
// (the target's host) on a connection with sni, or nil. Paths do not apply
// to CONNECT.
func (t Table) MatchConnect(host, sni string) *Route {
	host = StripPort(host)
	for _, r := range t {
		if r.Connect && r.MatchesHost(host) && r.ServerName.Matches(sni) {
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
