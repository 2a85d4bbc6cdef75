package workers

// serveHTTP2 serves a connection whose TLS handshake negotiated ALPN "h2",
// until it ends; the caller closes it. Temporary stub so that the h1tls
// branch compiles: the real one (workers/h2*.go) replaces this file at
// merge.
func (m *Manager) serveHTTP2(cc *clientConn) { /* merged away */ }
