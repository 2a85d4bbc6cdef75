package workers

import "strings"

// match returns the first route that matches host (as in the Host header)
// and path, or nil.
func (ls *listenerSnap) match(host, path string) *route {
	if len(ls.routes) == 0 {
		return nil
	}
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.matches(host, path) {
			return r
		}
	}
	return nil
}

// matchConnect returns the first route that lets CONNECT through to host
// (the target's host), or nil. Paths do not apply to CONNECT.
func (ls *listenerSnap) matchConnect(host string) *route {
	host = stripPort(host)
	for _, r := range ls.routes {
		if r.connect && r.matchesHost(host) {
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
	switch r.hostKin {
	case hostExact:
		return strings.EqualFold(host, r.host)
	case hostWildcard:
		return len(host) > len(r.host) && strings.EqualFold(host[len(host)-len(r.host):], r.host)
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
