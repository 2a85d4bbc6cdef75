package loadgen

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// clientHTTP2 is one HTTP/2 client: its own transport (so its own
// connection), and Options.Streams request loops sharing it.
func (r *Run) clientHTTP2(ctx context.Context) {
	u, _ := url.Parse(r.opts.URL) // checked by Start
	tr := &http2.Transport{DisableCompression: true}
	dialer := &net.Dialer{Timeout: r.opts.Timeout}
	if u.Scheme == "https" {
		tr.TLSClientConfig = r.clientTLSHTTP2()
		tr.DialTLSContext = func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
			r.conns.Add(1)
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			st := tc.ConnectionState()
			if st.DidResume {
				r.resumedHandshakes.Add(1)
			} else {
				r.fullHandshakes.Add(1)
			}
			if st.NegotiatedProtocol != http2.NextProtoTLS {
				tc.Close()
				return nil, fmt.Errorf("loadgen: %s: the server chose ALPN %q, not h2", addr, st.NegotiatedProtocol)
			}
			return &h2TLSConn{h2Conn: r.watchFrames(tc), tls: tc}, nil
		}
	} else {
		// h2c with prior knowledge: the "TLS" dial is a plain one.
		tr.AllowHTTP = true
		tr.DialTLSContext = func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			r.conns.Add(1)
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return r.watchFrames(c), nil
		}
	}
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	for range r.opts.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.requestLoop(ctx, tr)
		}()
	}
	wg.Wait()
}

// clientTLSHTTP2 is one HTTP/2 client's TLS config: h2 by ALPN only.
func (r *Run) clientTLSHTTP2() *tls.Config {
	var c *tls.Config
	if r.opts.TLS != nil {
		c = r.opts.TLS.Clone()
	} else {
		c = &tls.Config{InsecureSkipVerify: true}
	}
	if r.opts.SessionCache && c.ClientSessionCache == nil {
		c.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	if !slices.Contains(c.NextProtos, http2.NextProtoTLS) {
		c.NextProtos = []string{http2.NextProtoTLS}
	}
	return c
}

// watchFrames wraps an HTTP/2 client connection so that the frames the
// server sends are followed: GOAWAYs are counted, and so is an end of the
// connection by the server that no GOAWAY announced.
func (r *Run) watchFrames(c net.Conn) *h2Conn {
	return &h2Conn{Conn: c, run: r}
}

// h2Conn follows the frame headers in what the server sends (after the
// TLS layer, if any: HTTP/2 frames from the first byte, since the server's
// preface is a SETTINGS frame). A frame header is 9 bytes: length (3),
// type (1), flags (1), stream id (4).
type h2Conn struct {
	net.Conn
	run *Run

	// Read runs on the transport's read loop only; hdr, hdrLen and skip
	// are its.
	hdr    [9]byte
	hdrLen int
	skip   int // payload bytes of the current frame still to come

	sawGoAway atomic.Bool
	closing   atomic.Bool // Close called: the client ended it
	counted   atomic.Bool // the end was looked at once
}

// frameTypeGoAway is GOAWAY's frame type (RFC 9113 §6.8).
const frameTypeGoAway = 0x7

func (c *h2Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.follow(p[:n])
	if err != nil && !c.closing.Load() && !c.sawGoAway.Load() && c.counted.CompareAndSwap(false, true) {
		c.run.closedWithoutGoAway.Add(1)
	}
	return n, err
}

func (c *h2Conn) follow(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.hdrLen:], b)
		c.hdrLen += k
		b = b[k:]
		if c.hdrLen < len(c.hdr) {
			return
		}
		c.hdrLen = 0
		c.skip = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
		if c.hdr[3] == frameTypeGoAway {
			c.sawGoAway.Store(true)
			c.run.goAways.Add(1)
		}
	}
}

func (c *h2Conn) Close() error {
	c.closing.Store(true)
	return c.Conn.Close()
}

// h2TLSConn is an h2Conn over TLS: the transport reads the connection's
// TLS state (resp.TLS) through ConnectionState.
type h2TLSConn struct {
	*h2Conn
	tls *tls.Conn
}

func (c *h2TLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }
