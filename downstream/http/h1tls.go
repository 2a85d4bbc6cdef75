package httpfront

import "github.com/hotproxy/hotproxy/downstream/tcp"

// TLS on an HTTP/1.1 client connection: the handshake before the first
// request, the idle wait between requests, and the close (close_notify).

// handshake runs the TLS handshake (the worker's: Host.Handshake) and
// keeps the SNI for route matching. false: it failed or timed out
// (counted); the connection ends.
func (cc *Conn) handshake() bool {
	cs, err := cc.l.Host.Handshake(cc.tls, cc.tcp)
	if err != nil {
		if cc.l.Env.Log.IsDebug() {
			cc.l.Env.Log.Debug("TLS handshake failed", "listener", cc.l.Name, "client", cc.tcp.RemoteAddr(), "error", err)
		}
		return false
	}
	cc.sni, cc.handshook = cs.ServerName, true
	return true
}

// waitTLSRecord is waitReadable for a TLS connection: a blocking read of
// one byte, then the byte goes into a fresh read buffer. A peek on the
// socket would be wrong here: crypto/tls may already hold the next
// request in its own buffers (a pipelined request decrypted with the
// previous one, or a TLS 1.3 client's request read with its Finished), and
// the socket would then stay silent until the idle timeout. The price is
// what tls.Conn keeps between records while the connection idles, and a
// goroutine stack grown by the blocked read: about 7 KiB of heap and 8 KiB
// of stack per idle TLS connection, against 1.3 and 4 KiB for plaintext
// (TestTLSIdleMemory). The 32 KiB read buffer is not held: it is taken
// once the byte is in.
func (cc *Conn) waitTLSRecord() bool {
	cc.idleSince.Store(max(Monotime(), 1))
	defer cc.idleSince.Store(0)
	cc.setReadDeadline(cc.settings.IdleTimeout)
	if n, _ := cc.tls.Read(cc.idleByte[:]); n == 0 {
		return false // EOF, the idle timeout or a drain's close
	}
	cc.st.RxBytes.Add(1)
	cc.takeState()
	cc.rbuf[cc.w] = cc.idleByte[0]
	cc.w++
	return true
}

// closeAtEnd is the connection goroutine's close: a TLS connection that
// finished its handshake and was not closed by a drain says close_notify
// first.
func (cc *Conn) closeAtEnd() {
	if cc.handshook && !cc.closed.Load() {
		cc.tls.Close()
	}
	cc.Close()
}

// closeWrite half-closes the connection (TLS: close_notify, then FIN).
func (cc *Conn) closeWrite() {
	if cc.tls != nil {
		tcp.CloseWrite(cc.tls)
		return
	}
	cc.tcp.CloseWrite()
}
