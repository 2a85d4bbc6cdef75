package config

import "slices"

// AccessLog is one access-log file of a listener.
type AccessLog struct {
	// Path is the file, opened with O_APPEND (created 0640) and opened
	// again on SIGUSR1, after logrotate moved it.
	Path string `toml:"path" json:"path"`
	// Format is "json" or a format string with %NAME% variables
	// (AccessLogVariables); default DefaultAccessLogFormat.
	Format string `toml:"format" json:"format" default:"%CLIENT_IP% [%START_TIME%] \"%METHOD% %PATH% %PROTOCOL%\" %RESPONSE_CODE% %BYTES_SENT% %DURATION% %UPSTREAM_HOST% %RETRIES%"`
	// QueueSize bounds the records waiting for the writer; a full queue
	// drops the record and counts it in access_log.dropped, never
	// blocking a request.
	QueueSize int `toml:"queue_size" json:"queue_size" default:"4096" bound:"16..1048576" note:"records waiting for the writer; default %v"`
}

// TrustsForwardedFor reports whether the client's X-Forwarded-For chain is
// kept (the default) or replaced.
func (l Listener) TrustsForwardedFor() bool {
	return l.TrustForwardedFor == nil || *l.TrustForwardedFor
}

// ParksIdleConnections reports whether an http listener's idle HTTP/1.1
// keep-alive connections park (park_idle_connections): by default when
// it has no TLS, never with TLS (validation refuses true there).
func (l Listener) ParksIdleConnections() bool {
	if l.Protocol != ProtocolHTTP || l.TLS != nil {
		return false
	}
	return l.ParkIdleConnections == nil || *l.ParkIdleConnections
}

// Route matches HTTP requests by host and path and says what to do.
type Route struct {
	// Host matches the request's Host exactly, or "*.example.com" matches
	// any subdomain of example.com. Empty matches any host.
	Host string `toml:"host,omitempty" json:"host,omitempty"`
	// ServerName matches the TLS connection's SNI like Host matches the
	// Host header (exact, or "*.example.com"); a connection without TLS
	// or without SNI matches no route that sets it. Empty matches any.
	ServerName string `toml:"server_name,omitempty" json:"server_name,omitempty"`
	// Prefix matches a path prefix; Path matches a path exactly. One of
	// the two is required.
	Prefix string `toml:"prefix,omitempty" json:"prefix,omitempty"`
	Path   string `toml:"path,omitempty" json:"path,omitempty"`

	// Headers are request header fields that must all match too (AND).
	Headers []HeaderMatch `toml:"headers,omitempty" json:"headers,omitempty"`

	// Exactly one action: a cluster, a weighted split over clusters, or
	// a direct response.
	Cluster string `toml:"cluster,omitempty" json:"cluster,omitempty"`
	// WeightedClusters splits the route's requests over clusters: each
	// request goes to one of them, picked at random in proportion to
	// its weight.
	WeightedClusters []WeightedCluster `toml:"weighted_clusters,omitempty" json:"weighted_clusters,omitempty"`
	DirectResponse   *DirectResponse   `toml:"direct_response,omitempty" json:"direct_response,omitempty"`

	// Timeout bounds a proxied request from its first byte to the end
	// of the response head, retries included; 0: the listener's
	// request_timeout.
	Timeout Duration `toml:"timeout,omitzero" json:"timeout,omitempty" bound:"10ms..24h"`
	// RetryOn lists the conditions a request is sent again on
	// (RetryConditions), to another endpoint where there is one. Only a
	// request whose body is already buffered whole is retried.
	RetryOn []string `toml:"retry_on,omitempty" json:"retry_on,omitempty"`
	// NumRetries bounds the retries of one request (default
	// DefaultNumRetries when retry_on is set; an explicit 0 stays 0).
	NumRetries *int `toml:"num_retries,omitzero" json:"num_retries,omitempty" bound:"0..10" note:"retries of one request; default %v with retry_on"`
	// PerTryTimeout bounds each attempt up to the response head; 0:
	// only Timeout.
	PerTryTimeout Duration `toml:"per_try_timeout,omitzero" json:"per_try_timeout,omitempty" bound:"10ms..24h"`
	// RetryNonIdempotent allows retrying a POST or PATCH whose bytes
	// reached an upstream (which may have acted on it); a connect
	// failure is retried whatever the method.
	RetryNonIdempotent bool `toml:"retry_non_idempotent,omitzero" json:"retry_non_idempotent,omitempty"`
	// Connect lets CONNECT requests whose target host matches Host open
	// a tunnel through this route: the proxy answers 200 and relays the
	// bytes both ways to an endpoint of Cluster (path and prefix do not
	// apply to them). Without it CONNECT is refused with 405.
	Connect bool `toml:"connect,omitzero" json:"connect,omitempty"`
}

// ProxiesToCluster reports whether the route's action sends requests to
// a cluster (cluster or weighted_clusters), not a direct response.
func (r *Route) ProxiesToCluster() bool { return r.Cluster != "" || len(r.WeightedClusters) > 0 }

// ClusterNames lists the clusters the route sends requests to: its
// cluster, or those of its weighted split (nil for a direct response).
func (r *Route) ClusterNames() []string {
	if r.Cluster != "" {
		return []string{r.Cluster}
	}
	names := make([]string, 0, len(r.WeightedClusters))
	for _, w := range r.WeightedClusters {
		names = append(names, w.Cluster)
	}
	return names
}

// Clone returns a copy of r that shares no slice or pointer with it.
func (r Route) Clone() Route {
	r.RetryOn = slices.Clone(r.RetryOn)
	r.WeightedClusters = slices.Clone(r.WeightedClusters)
	r.Headers = slices.Clone(r.Headers)
	for i := range r.Headers {
		if e := r.Headers[i].Exact; e != nil {
			r.Headers[i].Exact = new(*e)
		}
	}
	if r.NumRetries != nil {
		r.NumRetries = new(*r.NumRetries)
	}
	if r.DirectResponse != nil {
		d := *r.DirectResponse
		r.DirectResponse = &d
	}
	return r
}

// HeaderMatch is one request header field a route requires (Envoy's
// HeaderMatcher, in part). Name is matched without case; a field that
// occurs more than once is matched on its values joined with ",", as
// Envoy does (RFC 9110 5.3: the same meaning). Exactly one of Exact,
// Prefix and Present is given. ":method" matches the request method,
// over HTTP/1.1 and HTTP/2 alike, and "host" the Host field or, over
// HTTP/2, :authority.
type HeaderMatch struct {
	Name string `toml:"name" json:"name"`
	// Exact: the value is this string (it may be empty).
	Exact *string `toml:"exact,omitempty" json:"exact,omitempty"`
	// Prefix: the value starts with this (not empty) string.
	Prefix string `toml:"prefix,omitempty" json:"prefix,omitempty"`
	// Present: the field is there, whatever its value.
	Present bool `toml:"present,omitzero" json:"present,omitempty"`
	// IgnoreCase compares exact and prefix without ASCII case.
	IgnoreCase bool `toml:"ignore_case,omitzero" json:"ignore_case,omitempty"`
	// Invert matches a request that the test does not match. As in
	// Envoy, a field that is absent fails exact and prefix whether
	// inverted or not; present = true with invert = true matches a
	// request without the field.
	Invert bool `toml:"invert,omitzero" json:"invert,omitempty"`
}

// WeightedCluster is one cluster of a route's weighted split.
type WeightedCluster struct {
	Cluster string `toml:"cluster" json:"cluster"`
	Weight  int    `toml:"weight" json:"weight" bound:"1..1000000" note:"a share of the route's requests, weight/total; there is no default"`
}

// DirectResponse is answered by the proxy itself. Body may contain
// %VERSION%, %EPOCH%, %PID% and %HOSTNAME%, replaced when the generation
// starts.
type DirectResponse struct {
	Status      int    `toml:"status" json:"status" bound:"200..599" note:"a final HTTP status; there is no default"`
	Body        string `toml:"body" json:"body"`
	ContentType string `toml:"content_type,omitempty" json:"content_type,omitempty" default:"text/plain; charset=utf-8"`
}
