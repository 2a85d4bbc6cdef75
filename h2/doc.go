// Package h2 is hotproxy's own HTTP/2 connection engine (RFC 9113), built on
// golang.org/x/net/http2's Framer and hpack codecs only (not its Server,
// Transport or net/http types). It imports nothing of the project.
//
// The server side: NewServerConn wraps an accepted net.Conn (TLS with ALPN
// "h2", or h2c with prior knowledge), Serve runs the frame read loop in the
// calling goroutine and calls Handler.ServeH2 once per request, on a small
// pool of goroutines owned by the connection (at most MaxConcurrentStreams,
// reused from stream to stream: no goroutine is started per stream once the
// pool is warm). A request whose whole body arrives within
// MaxRequestBodyBuffer is handed over buffered (Stream.Body); a larger one
// streams through Stream.Read. Responses go out through
// Stream.WriteHeaders, Write, WriteLast, WriteTrailers and CloseWrite; frames of every
// stream are coalesced into one write system call by a single writer
// goroutine per connection.
//
//	sc := h2.NewServerConn(conn, preread, &h2.ServerConfig{}, handler)
//	go func() { <-draining; sc.Shutdown() }()
//	err := sc.Serve()
//
// When a handler runs: at once for a request that ended with its HEADERS,
// for CONNECT (passed through as is; the proxy answers 405) and for a
// content-length above MaxRequestBodyBuffer (streaming); with the whole
// body buffered when it ends within MaxRequestBodyBuffer (a content-length
// within it, or no content-length and END_STREAM among the bytes already
// read); otherwise, streaming, as soon as the read loop has consumed what
// it read, so a bidirectional gRPC stream is never held back.
//
// Writing: WriteHeaders (1xx heads may come first), Write (flow-controlled,
// blocks while the window is closed), WriteLast (the last bytes, in the
// frame that ends the stream), WriteTrailers or CloseWrite to end the
// stream; returning from ServeH2 ends it too. Frames are queued, not
// written, until the stream ends, Flush is called, 16 KiB are queued or a
// writer must wait: a proxy streaming a response calls Flush after each
// upstream read. Stream objects are pooled: nothing of a Stream (its
// Fields, Body, Done channel) may be kept after ServeH2 returns.
//
// Protections against the known HTTP/2 attacks are built in and tuned by
// ServerConfig: Rapid Reset (streams count against MaxConcurrentStreams
// until their handler returns, and resets are rate-limited), CONTINUATION
// floods (MaxHeaderBlockBytes), HPACK bombs (HeaderTableSize,
// MaxHeaderListSize), control-frame reply floods (MaxQueuedControlFrames),
// empty-frame floods, WINDOW_UPDATE overflow, stream-id exhaustion and
// clients that stop reading (WriteStallTimeout).
//
// The shared primitives (flow.go, settings.go, headers.go, writebuf.go) are
// side-neutral: the client side of this package reuses them.
package h2
