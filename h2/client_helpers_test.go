package h2

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientTestTimeout bounds every wait in these tests (a busy 2-core CI
// machine included).
const clientTestTimeout = 20 * time.Second

// clientDial dials addr and starts a ClientConn, closed at cleanup.
func clientDial(tb testing.TB, addr string, cfg *ClientConfig) *ClientConn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, clientTestTimeout)
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	cc, err := NewClientConn(c, cfg)
	if err != nil {
		c.Close()
		tb.Fatalf("NewClientConn: %v", err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// clientXNetServer serves h with x/net's http2.Server on loopback h2c.
func clientXNetServer(tb testing.TB, h http.Handler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http2.Server{}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(c, &http2.ServeConnOpts{Handler: h})
		}
	}()
	return ln.Addr().String()
}

// clientTestCert is a self-signed certificate for 127.0.0.1.
func clientTestCert(tb testing.TB) (tls.Certificate, *x509.CertPool) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "h2client test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// clientRoundTrip sends a request and reads the whole response.
func clientRoundTrip(tb testing.TB, cc *ClientConn, h *RequestHead) (status int, fields []hpack.HeaderField, body []byte, trailers []hpack.HeaderField, err error) {
	tb.Helper()
	s, err := cc.OpenStream(h)
	if err != nil {
		return 0, nil, nil, nil, err
	}
	defer s.Release()
	status, f, err := s.ResponseHead()
	if err != nil {
		return 0, nil, nil, nil, err
	}
	fields = append([]hpack.HeaderField(nil), f...)
	body, err = io.ReadAll(s)
	if err != nil {
		return status, fields, body, nil, err
	}
	trailers = append([]hpack.HeaderField(nil), s.Trailers()...)
	return status, fields, body, trailers, nil
}

func clientField(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// clientRawPeer is a hand-written HTTP/2 server on loopback for hostile
// peers: it reads the client preface, sends its SETTINGS, and runs the
// script on the one connection it accepts.
type clientRawPeer struct {
	tb   testing.TB
	conn net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	eb   bytes.Buffer
}

// clientStartRawPeer listens, accepts one connection and runs script in
// a goroutine; done closes when script returns.
func clientStartRawPeer(tb testing.TB, settings []http2.Setting, beforeAccept func(*net.TCPListener), script func(p *clientRawPeer)) (addr string, done chan struct{}) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	if beforeAccept != nil {
		beforeAccept(ln.(*net.TCPListener))
	}
	done = make(chan struct{})
	// Wait for the script (after the client's cleanup closed its end), so
	// that a failing test does not leave it running past its test.
	tb.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(clientTestTimeout):
		}
	})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			tb.Errorf("raw peer accept: %v", err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(clientTestTimeout))
		pre := make([]byte, len(clientPreface))
		if _, err := io.ReadFull(c, pre); err != nil || string(pre) != clientPreface {
			tb.Errorf("raw peer: bad preface %q: %v", pre, err)
			return
		}
		p := &clientRawPeer{tb: tb, conn: c, fr: http2.NewFramer(c, c)}
		p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		p.fr.MaxHeaderListSize = 1 << 20
		p.enc = hpack.NewEncoder(&p.eb)
		if err := p.fr.WriteSettings(settings...); err != nil {
			tb.Errorf("raw peer: write settings: %v", err)
			return
		}
		script(p)
	}()
	return ln.Addr().String(), done
}

// next returns the next frame that is not SETTINGS, WINDOW_UPDATE or a
// PING ACK (it acknowledges the client's SETTINGS); nil on error.
func (p *clientRawPeer) next() http2.Frame {
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			return nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				p.fr.WriteSettingsAck()
			}
			continue
		case *http2.WindowUpdateFrame:
			continue
		}
		return f
	}
}

// request waits for the next request HEADERS and returns its stream id.
func (p *clientRawPeer) request() uint32 {
	for {
		f := p.next()
		if f == nil {
			p.tb.Errorf("raw peer: connection ended waiting for a request")
			return 0
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			return h.StreamID
		}
	}
}

// headers sends a header block (as the fields say, not validated).
func (p *clientRawPeer) headers(id uint32, end bool, fields ...string) {
	p.eb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.eb.Bytes(), EndStream: end, EndHeaders: true})
}

// waitFor reads until a frame that matches; nil when the connection
// ends first.
func (p *clientRawPeer) waitFor(match func(http2.Frame) bool) http2.Frame {
	for {
		f := p.next()
		if f == nil || match(f) {
			return f
		}
	}
}

// waitGoAway reads until GOAWAY and returns its code (or -1 on EOF).
func (p *clientRawPeer) waitGoAway() int64 {
	f := p.waitFor(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	if f == nil {
		return -1
	}
	return int64(f.(*http2.GoAwayFrame).ErrCode)
}

// waitRST reads until RST_STREAM and returns its code (or -1 on EOF).
func (p *clientRawPeer) waitRST() int64 {
	f := p.waitFor(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok })
	if f == nil {
		return -1
	}
	return int64(f.(*http2.RSTStreamFrame).ErrCode)
}

func clientWaitDone(tb testing.TB, cc *ClientConn) error {
	tb.Helper()
	select {
	case <-cc.Done():
		return cc.Err()
	case <-time.After(clientTestTimeout):
		tb.Fatalf("connection still alive after %v", clientTestTimeout)
		return nil
	}
}

func clientWaitChan(tb testing.TB, ch <-chan struct{}, what string) {
	tb.Helper()
	select {
	case <-ch:
	case <-time.After(clientTestTimeout):
		tb.Fatalf("%s: not done after %v", what, clientTestTimeout)
	}
}

func clientConnErrCode(err error) (http2.ErrCode, bool) {
	var ce *ClientConnError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	return 0, false
}

var clientGET = &RequestHead{Method: "GET", Scheme: "http", Authority: "test", Path: "/", EndStream: true}
