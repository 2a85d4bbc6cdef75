// Package tcp is the TCP front end: one accepted client connection of a
// tcp listener proxied, byte for byte, to an endpoint of its cluster —
// spliced in the kernel between two TCP sockets, through a buffer where
// one side is TLS — with an idle timeout over both directions, and TLS
// passthrough, where the client's ClientHello (read, never answered)
// picks the cluster by its SNI.
//
// It sits beside the exchange core, not inside it: there is no request
// here. The worker that accepted the connection hands it what it needs
// (the listener's view for this worker, its stats lanes, the context
// that bounds dials) and keeps the rest — the connection set, the
// connection slot, the TLS handshake — so that this package imports no
// worker.
package tcp
