package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// loopbackAddress reports whether a valid listen address binds loopback
// only: a loopback IP, or the name localhost. An empty host binds every
// address.
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback()
	}
	return strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

// checkAddress checks a "host:port" address and returns what is wrong with
// it, value quoted first, or "". emptyHost allows ":8080" (all addresses);
// minPort is 0 where port 0 (any free port) is allowed, else 1.
func checkAddress(addr string, emptyHost bool, minPort int) string {
	example := "127.0.0.1:8080"
	if minPort > 0 {
		example = "127.0.0.1:9000"
	}
	if addr == "" {
		return fmt.Sprintf("missing (write host:port, like %q)", example)
	}
	q := quote(addr)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%s: not host:port (write it like %q, or %q for IPv6)", q, example, "[::1]:8080")
	}
	if port == "" || strings.TrimLeft(port, "0123456789") != "" {
		return fmt.Sprintf("%s: port %s is not a number", q, quote(port))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < minPort || n > 65535 {
		if minPort == 0 {
			return fmt.Sprintf("%s: port out of range 1-65535 (or 0 for any free port)", q)
		}
		return fmt.Sprintf("%s: port out of range 1-65535", q)
	}
	if host == "" {
		if emptyHost {
			return ""
		}
		return fmt.Sprintf("%s: missing host (write it like %q)", q, example)
	}
	if strings.Contains(host, ":") || strings.HasPrefix(addr, "[") {
		// An IPv6 literal (it came in brackets).
		if !strings.HasPrefix(addr, "[") {
			return fmt.Sprintf("%s: put an IPv6 address in brackets, like %q", q, "[::1]:8080")
		}
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return fmt.Sprintf("%s: %s is not an IPv6 address", q, quote(host))
		}
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	if !validHostname(host) {
		return fmt.Sprintf("%s: %s is neither an IP address nor a valid hostname", q, quote(host))
	}
	return ""
}

// validHostname reports whether s is a DNS name: dot-separated labels of
// letters, digits, '-' and '_', not starting or ending with '-', the last
// one not all digits (which would be a mistyped IPv4 address).
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// checkRouteHost checks a route's host: a name, an IP address, or
// "*.suffix", each with an optional port.
func checkRouteHost(h string) string {
	name := h
	if host, port, err := net.SplitHostPort(h); err == nil {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strings.TrimLeft(port, "0123456789") != "" {
			return "port " + quote(port) + " out of range 1-65535"
		}
		name = host
	}
	if strings.HasPrefix(name, "*.") {
		name = name[2:]
		if strings.Contains(name, "*") {
			return "\"*\" may only be the first label, as in \"*.example.com\""
		}
	} else if strings.Contains(name, "*") {
		return "\"*\" may only be the first label, as in \"*.example.com\" (leave host out to match any host)"
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return ""
	}
	if !validHostname(name) {
		return "not a hostname (write it like \"example.com\" or \"*.example.com\")"
	}
	return ""
}

// normAddress returns a form of a valid listen address under which two
// addresses that bind the same socket are equal, or "" for port 0 (every
// port-0 listener gets a port of its own).
func normAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if p, _ := strconv.Atoi(port); p == 0 {
		return ""
	}
	port = strconv.Itoa(mustAtoi(port))
	if a, err := netip.ParseAddr(host); err == nil {
		if a.IsUnspecified() {
			host = "" // 0.0.0.0, :: and "" all mean every address
		} else {
			host = a.String()
		}
	} else {
		host = strings.ToLower(strings.TrimSuffix(host, "."))
	}
	return net.JoinHostPort(host, port)
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
