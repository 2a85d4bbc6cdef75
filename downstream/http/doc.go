// Package httpfront is the HTTP front end: what an accepted client
// connection of an http listener is served by, HTTP/1.1 and HTTP/2 (TLS
// ALPN h2, or h2c with prior knowledge), up to the exchange core
// (package exchange) that proxies each request.
//
//   - HTTP/1.1 (h1*.go): one goroutine per connection (or none while it
//     is parked: idlepoll_linux.go), the head parsed in place, the
//     exchange to an HTTP/1.1 cluster (h1proxy.go, h1retry.go,
//     h1response.go, h1body.go) or an HTTP/2 one (h2upstream_h1.go),
//     Upgrade and CONNECT tunnels.
//   - HTTP/2 (h2.go, h2front*.go): the connection served by our engine
//     (package h2), each stream routed and proxied to an HTTP/1.1
//     cluster (h2front_h1.go) or an HTTP/2 one (h2front_h2.go).
//
// Both client protocols are one package because they share what a
// reader would otherwise find cut in two: the listener's stats lanes
// (Stats), its compiled settings (Settings, H2Params), the access-log
// sink, the HTTP/2 upstream transport of a worker cluster, the buffers
// a connection holds (BufHolding); and an h2c connection is detected on
// the HTTP/1.1 connection that accepted it.
//
// The worker (package workers) imports this package, never the reverse,
// as it does downstream/tcp. It builds, once, an Env per Manager, a
// Worker per worker and a Listener per worker and http listener, with a
// Host that answers for the worker (the routing View of the current
// snapshot, the TLS handshake, the connection's end, overload counts),
// and hands each accepted connection to NewConn and Conn.Serve. It
// keeps the accept, the connection set and slot, the drain, steering,
// overload decisions and snapshots; what it does to a connection (close
// the idle ones, reset the biggest buffer holders, GOAWAY on drain) goes
// through Conn's and Env's exported methods.
package httpfront
