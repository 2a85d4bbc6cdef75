package tcp

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"

	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
)

// TLS passthrough (a tcp listener with sni_routes): the ClientHello is read,
// never answered, its SNI picks the cluster, and the bytes read go to the
// upstream ahead of everything else, so that the upstream terminates the
// TLS the client began. crypto/tls parses the ClientHello: a hand-written
// parser of bytes from anyone would need its own fuzzing, and would lag
// behind the extensions clients add.

// StatSNINoRoute counts a passthrough listener's connections closed because
// no sni_route named their SNI (or they sent no ClientHello with one) and
// the listener has no default cluster.
const StatSNINoRoute = "sni.no_route"

// maxClientHello bounds what is read while looking for the ClientHello:
// one full TLS record (16 KiB); a ClientHello with post-quantum key shares
// is about 2 KiB.
const maxClientHello = 16 << 10

// passthroughCluster reads the ClientHello from client and picks its
// cluster: the first sni_route naming its SNI, else the listener's
// cluster (also for a client that sent no ClientHello, or one without
// SNI), else nil. hello is every byte read from the client, for the
// upstream.
func (lv *Listener) passthroughCluster(client *net.TCPConn) (wc *upstream.WorkerCluster, hashOn route.HashSource, hello []byte) {
	sni, hello, err := readClientHello(client, lv.HelloTimeout)
	if i := lv.SNIRoutes.Match(sni); i >= 0 {
		return lv.SNIClusters[i], lv.SNIRoutes[i].HashOn, hello
	}
	if len(hello) == 0 && err != nil && !isTimeout(err) {
		// EOF or reset before a byte: nobody to serve.
		return nil, route.HashSource{}, nil
	}
	return lv.Cluster, lv.HashOn, hello
}

// errHelloRead ends the handshake crypto/tls began for readClientHello
// once the ClientHello is parsed.
var errHelloRead = errors.New("ClientHello read")

// errHelloTooLarge: no ClientHello within maxClientHello bytes.
var errHelloTooLarge = errors.New("no TLS ClientHello in the first 16 KiB")

// readClientHello reads from c until crypto/tls has parsed a ClientHello
// (or failed to: not TLS, too large, EOF, timeout) and returns its SNI (""
// if none) with every byte it read, which the client considers sent and
// the upstream must get. err is the reason no ClientHello was parsed (nil
// when one was, SNI or not).
func readClientHello(c *net.TCPConn, timeout time.Duration) (sni string, hello []byte, err error) {
	rec := &helloRecorder{Conn: c, buf: make([]byte, 0, 2<<10)}
	parsed := false
	cfg := &tls.Config{GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, parsed = hi.ServerName, true
		return nil, errHelloRead
	}}
	c.SetReadDeadline(time.Now().Add(timeout))
	herr := tls.Server(rec, cfg).Handshake()
	c.SetReadDeadline(time.Time{})
	switch {
	case parsed:
		return sni, rec.buf, nil
	case rec.err != nil:
		return "", rec.buf, rec.err
	}
	return "", rec.buf, herr
}

// helloRecorder is the client connection as readClientHello's crypto/tls
// sees it: what it reads is kept (up to maxClientHello), what it writes
// (the alert that ends the aborted handshake) is dropped, so the client
// sees nothing of it.
type helloRecorder struct {
	net.Conn
	buf []byte
	err error // the socket's read error, if any
}

func (r *helloRecorder) Read(p []byte) (int, error) {
	room := maxClientHello - len(r.buf)
	if room <= 0 {
		r.err = errHelloTooLarge
		return 0, r.err
	}
	n, err := r.Conn.Read(p[:min(len(p), room)])
	r.buf = append(r.buf, p[:n]...)
	if err != nil {
		r.err = err
	}
	return n, err
}

func (r *helloRecorder) Write(p []byte) (int, error) { return len(p), nil }

func (r *helloRecorder) Close() error { return nil }

var _ io.ReadWriter = (*helloRecorder)(nil)
