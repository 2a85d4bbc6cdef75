package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/h2"
)

// TestH2PoolRefusesTLSPeerWithoutH2: a TLS endpoint of an http2 cluster
// whose handshake did not select h2 (a server that knows no ALPN) is a
// connect error naming the cluster, the endpoint and what to do; nothing
// is sent to it as HTTP/2.
func TestH2PoolRefusesTLSPeerWithoutH2(t *testing.T) {
	ca := newTestCA(t, "test")
	cert, _, _ := ca.issue("backend", []string{"127.0.0.1"}, false)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				b, _ := io.ReadAll(c)
				got <- b
			}()
		}
	}()
	spec := config.Cluster{Name: "grpc-tls", Endpoints: []string{ln.Addr().String()}, HTTP2: true,
		TLS: &config.ClusterTLS{CA: ca.pemOut}}
	wc := newWorkerCluster(t, spec, 0)
	pool := NewH2Pool(wc, H2PoolOptions{TLS: true})
	t.Cleanup(pool.CloseAll)
	var s H2Stream
	head := &h2.RequestHead{Method: "GET", Scheme: "https", Authority: "x", Path: "/", EndStream: true}
	err = pool.Open(context.Background(), 0, -1, false, time.Now().Add(5*time.Second), head, &s)
	defer s.Finish()
	var ce *ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("Open = %v, want a ConnectError", err)
	}
	for _, want := range []string{`cluster "grpc-tls"`, ln.Addr().String(), `ALPN chose ""`, "not h2", "remove clusters.http2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	select {
	case b := <-got:
		if len(b) > 0 {
			t.Errorf("%d bytes of HTTP/2 sent to a peer that did not select h2", len(b))
		}
	case <-time.After(5 * time.Second):
		t.Error("the refused connection was not closed")
	}
}

// h2TestPeer is a raw HTTP/2 server: it answers each request stream per
// answer (200 or a RST_STREAM code) and may send GOAWAY after n streams.
type h2TestPeer struct {
	addr  string
	conns chan int // one value per connection accepted: its index
}

func newH2TestPeer(tb testing.TB, answer func(conn int, stream uint32) (rst http2.ErrCode, goAway bool)) *h2TestPeer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	p := &h2TestPeer{addr: ln.Addr().String(), conns: make(chan int, 16)}
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns <- n
			go func(n int, c net.Conn) {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				pre := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(c, pre); err != nil {
					return
				}
				fr := http2.NewFramer(c, c)
				fr.WriteSettings()
				var hbuf strings.Builder
				enc := hpack.NewEncoder(&hbuf)
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					switch f := f.(type) {
					case *http2.SettingsFrame:
						if !f.IsAck() {
							fr.WriteSettingsAck()
						}
					case *http2.HeadersFrame:
						if !f.StreamEnded() {
							continue
						}
						rst, goAway := answer(n, f.StreamID)
						if rst != 0 {
							fr.WriteRSTStream(f.StreamID, rst)
						} else {
							hbuf.Reset()
							enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
							fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: []byte(hbuf.String()), EndHeaders: true, EndStream: true})
						}
						if goAway {
							fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, nil)
						}
					}
				}
			}(n, c)
		}
	}()
	return p
}

// TestH2PoolGoAwayRetiresConnection: a connection that received GOAWAY
// takes no new stream: the next try dials a new one, and the pool
// keeps one connection per endpoint otherwise (streams share it).
func TestH2PoolGoAwayRetiresConnection(t *testing.T) {
	peer := newH2TestPeer(t, func(conn int, stream uint32) (http2.ErrCode, bool) {
		return 0, conn == 0 && stream == 3 // the first connection goes away after its 2nd stream
	})
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{peer.addr}, HTTP2: true}, 0)
	pool := NewH2Pool(wc, H2PoolOptions{})
	t.Cleanup(pool.CloseAll)
	get := func(i int) {
		t.Helper()
		var s H2Stream
		defer s.Finish()
		head := &h2.RequestHead{Method: "GET", Scheme: "http", Authority: "x", Path: "/", EndStream: true}
		if err := pool.Open(context.Background(), 0, -1, false, time.Now().Add(5*time.Second), head, &s); err != nil {
			t.Fatalf("request %d: Open: %v", i, err)
		}
		if st, _, err := s.Stream.ResponseHead(); err != nil || st != 200 {
			t.Fatalf("request %d: %d, %v", i, st, err)
		}
		if _, err := io.Copy(io.Discard, s.Stream); err != nil {
			t.Fatalf("request %d: body: %v", i, err)
		}
	}
	for i := range 2 {
		get(i)
	}
	if n := len(peer.conns); n != 1 {
		t.Fatalf("%d connections for 2 requests, want 1 (streams share it)", n)
	}
	// The GOAWAY came with the 2nd response: wait for the pool to see it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		pool.mu.Lock()
		n := len(pool.connsByEndpoint[0])
		pool.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection that got GOAWAY is still offered new streams")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 2; i < 4; i++ {
		get(i)
	}
	if n := len(peer.conns); n != 2 {
		t.Errorf("%d connections, want 2 (one new after the GOAWAY)", n)
	}
}

// TestH2PoolNewConnectionAtStreamLimit: when the endpoint's connections
// are all at its MAX_CONCURRENT_STREAMS, a try gets a new connection
// rather than waiting; once streams end, the connections are reused
// (no third one), and CloseIdle closes those without streams.
func TestH2PoolNewConnectionAtStreamLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// The first stream is answered at once; the others once gate is
	// closed, so that two are open together.
	gate := make(chan struct{})
	var streams atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				pre := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(c, pre); err != nil {
					return
				}
				fr := http2.NewFramer(c, c)
				var wmu sync.Mutex // the answers' goroutines and the loop write
				fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
				var hbuf strings.Builder
				enc := hpack.NewEncoder(&hbuf)
				enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
				block := []byte(hbuf.String())
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					switch f := f.(type) {
					case *http2.SettingsFrame:
						if !f.IsAck() {
							wmu.Lock()
							fr.WriteSettingsAck()
							wmu.Unlock()
						}
					case *http2.HeadersFrame:
						id := f.StreamID
						first := streams.Add(1) == 1
						go func() {
							if !first {
								<-gate
							}
							wmu.Lock()
							defer wmu.Unlock()
							fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true})
						}()
					}
				}
			}(c)
		}
	}()
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{ln.Addr().String()}, HTTP2: true}, 0)
	pool := NewH2Pool(wc, H2PoolOptions{})
	t.Cleanup(pool.CloseAll)
	head := &h2.RequestHead{Method: "GET", Scheme: "http", Authority: "x", Path: "/", EndStream: true}
	open := func() *H2Stream {
		t.Helper()
		s := &H2Stream{}
		if err := pool.Open(context.Background(), 0, -1, false, time.Now().Add(5*time.Second), head, s); err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	}
	finish := func(s *H2Stream) {
		t.Helper()
		if st, _, err := s.Stream.ResponseHead(); err != nil || st != 200 {
			t.Fatalf("response: %d, %v", st, err)
		}
		s.Finish()
	}
	connections := func() int {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return len(pool.all)
	}
	// A first exchange, so that the peer's SETTINGS (limit 1) are in.
	finish(open())
	a := open()
	b := open() // the only connection is at its limit: a second one
	if n := connections(); n != 2 {
		t.Fatalf("%d connections for 2 concurrent streams at a limit of 1, want 2", n)
	}
	close(gate)
	finish(a)
	finish(b)
	finish(open())
	if n := connections(); n != 2 {
		t.Errorf("%d connections after the streams ended, want the 2 reused", n)
	}
	pool.CloseIdle()
	if n := connections(); n != 0 {
		t.Errorf("%d connections left after CloseIdle with no stream open, want 0", n)
	}
}
