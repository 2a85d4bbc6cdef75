package route

import (
	"fmt"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
)

// SNIRoute is a compiled sni_routes entry.
type SNIRoute struct {
	ServerNames []HostPattern
	Cluster     string
	HashOn      HashSource
}

// HostMatch is how a HostPattern matches.
type HostMatch uint8

const (
	HostAny HostMatch = iota
	HostExact
	HostWildcard // host holds ".example.com"
)

// Route is one compiled route. Exactly one of Cluster, Split and Direct
// is set.
type Route struct {
	// Index is the route's place in its listener's targets (its routes,
	// then the routes of the weighted splits' clusters) and so in a
	// worker's view of their clusters.
	Index    int
	HostKind HostMatch
	Host     string // lower case, no port
	Path     string
	Prefix   bool
	Cluster  string
	Direct   *DirectResponse
	Connect  bool // CONNECT requests may tunnel through it
	// serverName matches the TLS connection's SNI (any: server_name is
	// not set).
	ServerName HostPattern
	// Headers must all match too; none: no field is looked at.
	Headers []HeaderMatcher
	// Split is a weighted_clusters action: Match hands out one of its
	// routes, each a copy of this one for one cluster.
	Split *ClusterSplit

	// For a cluster: the route's timeout (resolved: its own, or the
	// listener's request_timeout), its retry policy, and what its
	// cluster hashes.
	Timeout time.Duration
	Retry   exchange.RetryPolicy
	HashOn  HashSource
	HTTP2   bool // its cluster speaks HTTP/2 (clusters.http2)
}

// HashSource is a cluster's hash_on, compiled: where the data path finds
// a request's key.
type HashSource struct {
	Kind HashKind
	Name string // header name (matched without case) or cookie name
}

// HashKind says where a request's hash key is found.
type HashKind uint8

const (
	HashNone HashKind = iota
	HashHeader
	HashCookie
	HashSourceIP
)

// DirectResponse is a direct_response with placeholders already replaced
// and its headers prebuilt.
type DirectResponse struct {
	Status int
	Body   []byte
	// Header values shared by every response: len == cap, so an
	// Add on a response's header copies instead of writing into them.
	ContentType   []string
	ContentLength []string
}

// CompileHostPattern compiles a host or server name as routes write it:
// empty or "*" (any), "name" (exact) or "*.example.com" (any subdomain);
// key names it in an error.
func CompileHostPattern(key, value string) (HostPattern, error) {
	host := strings.ToLower(StripPort(strings.TrimSpace(value)))
	switch {
	case host == "" || host == "*":
		return HostPattern{Kind: HostAny}, nil
	case strings.HasPrefix(host, "*."):
		if len(host) == 2 || strings.Contains(host[2:], "*") {
			return HostPattern{}, fmt.Errorf("%s %q: a wildcard is written \"*.example.com\"", key, value)
		}
		return HostPattern{Kind: HostWildcard, Name: host[1:]}, nil
	case strings.Contains(host, "*"):
		return HostPattern{}, fmt.Errorf("%s %q: a wildcard is only allowed as the first label (\"*.example.com\")", key, value)
	}
	return HostPattern{Kind: HostExact, Name: host}, nil
}
