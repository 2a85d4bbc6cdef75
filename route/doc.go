// Package route is the compiled, immutable routing data that every front
// end reads from a worker's snapshot: a listener's route table and how it
// matches a request (host patterns, paths, the TLS server name), what a
// route leads to (a cluster with its resolved timeout, retry policy and
// hash source, or a direct response), and a passthrough listener's
// sni_routes.
//
// The snapshot builder in workers compiles it from the config; nothing in
// it reads a raw config, and it imports no front end or worker, so the
// HTTP/1.1 and HTTP/2 front ends and the TCP proxy share one matcher.
package route
