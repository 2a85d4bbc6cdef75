// Package exchange is the core of one proxied request, whatever protocol
// the client and the upstream speak: the retry policy every path asks
// whether to try again and the one loop that asks it (RoundTrip, over
// the UpstreamTransport seam), the timeouts a run of tries keeps, the
// request head the upstream gets (the forwarding fields, hop-by-hop
// removal, X-Request-Id), the reading of an HTTP/1.1 upstream's
// response head and body bytes, and the HTTP/2 upstream transport
// (H2Transport over upstream.H2Pool). The front ends that read requests from clients
// (an HTTP/1.1 connection, an HTTP/2 stream) sit above it, the upstream
// transports (the HTTP/1.1 pool, the HTTP/2 multiplexed pool) below it;
// it knows neither a net/http type nor a connection.
//
// It is a package of its own, not a part of workers, so that the decision
// has one home that every front end and transport imports, and so that it
// cannot reach back into the workers that run it.
package exchange
