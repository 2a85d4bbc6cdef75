// Package httpfront is the HTTP front end: what an accepted client
// connection of an http listener is served by, HTTP/1.1 and HTTP/2 (TLS
// ALPN h2 or h2c), up to the exchange core that proxies each request.
//
// Both client protocols are one package because they share what a
// reader would otherwise find cut in two: the listener's stats lanes
// (Stats), its compiled connection settings (Settings), the access-log
// sink, the HTTP/2 upstream transport of a worker cluster, the buffers
// a connection holds (BufHolding), and an h2c connection is detected on
// the HTTP/1.1 connection that accepted it.
//
// The worker (package workers) imports this package, never the
// reverse, as it does downstream/tcp: it builds these pieces once per
// listener and per worker, and hands them to the front end.
//
// Not done yet (issue 21): the HTTP/1.1 connection loop and the HTTP/2
// front end themselves still live in workers (h1*.go, h2*.go); these
// are the pieces below them both, lowered first so that the move is a
// move.
package httpfront
