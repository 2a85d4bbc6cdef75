package h2

import (
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Hostile and odd peers: a hand-written server on loopback, frame by
// frame.

func TestClientGoAwayMidFlight(t *testing.T) {
	var goAwayCode http2.ErrCode
	var goAwayLast uint32 = 99
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		ids := []uint32{p.request(), p.request(), p.request()}
		if ids[0] != 1 || ids[1] != 3 || ids[2] != 5 {
			t.Errorf("stream ids %v, want 1 3 5", ids)
		}
		p.fr.WriteGoAway(3, http2.ErrCodeNo, []byte("draining"))
		for _, id := range ids[:2] {
			p.headers(id, false, ":status", "200", "content-length", "2")
			p.fr.WriteData(id, true, []byte("ok"))
		}
		if code := p.waitGoAway(); code != int64(http2.ErrCodeNo) {
			t.Errorf("client's GOAWAY code %d, want NO_ERROR after draining", code)
		}
	})
	cc := clientDial(t, addr, &ClientConfig{Events: ClientEvents{GoAway: func(code http2.ErrCode, last uint32, _ []byte) { goAwayCode, goAwayLast = code, last }}})
	var streams []*ClientStream
	for i := 0; i < 3; i++ {
		s, err := cc.OpenStream(clientGET)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for _, s := range streams[:2] {
		st, _, err := s.ResponseHead()
		body, rerr := io.ReadAll(s)
		if err != nil || st != 200 || string(body) != "ok" || rerr != nil {
			t.Fatalf("stream %d (at or below last-stream-id): %d %q %v %v", s.ID(), st, body, err, rerr)
		}
	}
	_, _, err := streams[2].ResponseHead()
	if !IsRetrySafe(err) {
		t.Fatalf("stream 5 above GOAWAY's last-stream-id 3: %v, want retry-safe", err)
	}
	if cc.CanTakeNewStream() {
		t.Fatal("CanTakeNewStream after GOAWAY")
	}
	if _, err := cc.OpenStream(clientGET); !IsRetrySafe(err) {
		t.Fatalf("OpenStream after GOAWAY: %v, want retry-safe refusal", err)
	}
	for _, s := range streams {
		s.Release()
	}
	clientWaitDone(t, cc)
	clientWaitChan(t, done, "raw peer")
	if goAwayCode != http2.ErrCodeNo || goAwayLast != 3 {
		t.Fatalf("Events.GoAway got code %v last %d", goAwayCode, goAwayLast)
	}
}

func TestClientResetByPeer(t *testing.T) {
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		p.fr.WriteRSTStream(p.request(), http2.ErrCodeRefusedStream)
		id := p.request()
		p.headers(id, false, ":status", "200")
		p.fr.WriteData(id, false, []byte("part"))
		p.fr.WriteRSTStream(id, http2.ErrCodeInternal)
		// Our reset: the client says CANCEL.
		id = p.request()
		if code := p.waitRST(); code != int64(http2.ErrCodeCancel) {
			t.Errorf("client's RST_STREAM code %d, want CANCEL", code)
		}
		// Still serving.
		id = p.request()
		p.headers(id, true, ":status", "204")
		p.waitGoAway()
	})
	cc := clientDial(t, addr, nil)
	_, _, _, _, err := clientRoundTrip(t, cc, clientGET)
	if !IsRetrySafe(err) {
		t.Fatalf("REFUSED_STREAM: %v, want retry-safe", err)
	}
	s, err := cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	if st, _, err := s.ResponseHead(); st != 200 || err != nil {
		t.Fatal(st, err)
	}
	_, err = io.ReadAll(s)
	var se *ClientStreamError
	if !errors.As(err, &se) || !se.Remote || se.Code != http2.ErrCodeInternal || IsRetrySafe(err) {
		t.Fatalf("RST INTERNAL_ERROR after a response head: %v, want a remote ClientStreamError, not retry-safe", err)
	}
	s.Release()
	s, err = cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	s.Reset(http2.ErrCodeCancel)
	if _, _, err := s.ResponseHead(); err == nil {
		t.Fatal("ResponseHead after Reset: no error")
	}
	s.Release()
	if st, _, _, _, err := clientRoundTrip(t, cc, clientGET); st != 204 || err != nil {
		t.Fatalf("after resets: %d %v", st, err)
	}
	cc.Close()
	clientWaitChan(t, done, "raw peer")
}

func TestClientHonoursPeerSettings(t *testing.T) {
	got := make(chan []byte, 8)
	addr, done := clientStartRawPeer(t, []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 1}, {ID: http2.SettingInitialWindowSize, Val: 10}},
		nil, func(p *clientRawPeer) {
			id := p.request()
			readData := func() []byte {
				f := p.waitFor(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
				if f == nil {
					return nil
				}
				return append([]byte(nil), f.(*http2.DataFrame).Data()...)
			}
			got <- readData() // 10 bytes: the stream window
			// Raise the initial window: the delta applies to the open stream.
			p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100})
			got <- readData()
			p.headers(id, true, ":status", "200")
			p.waitGoAway()
		})
	cc := clientDial(t, addr, nil)
	clientWaitPeerSettings(t, cc, func() bool { return cc.peerInitialWindow == 10 })
	s, err := cc.OpenStream(&RequestHead{Method: "POST", Scheme: "http", Authority: "t", Path: "/", Body: []byte(strings.Repeat("a", 100)), EndStream: false})
	if err != nil {
		t.Fatal(err)
	}
	if b := <-got; len(b) != 10 {
		t.Fatalf("first DATA %d bytes, want 10 (peer's INITIAL_WINDOW_SIZE)", len(b))
	}
	if cc.CanTakeNewStream() {
		t.Fatal("CanTakeNewStream with 1 open and peer's MAX_CONCURRENT_STREAMS 1")
	}
	if _, err := cc.OpenStream(clientGET); !IsRetrySafe(err) {
		t.Fatalf("second stream over MAX_CONCURRENT_STREAMS: %v, want a retry-safe refusal", err)
	}
	if b := <-got; len(b) != 90 {
		t.Fatalf("after the window grew: DATA %d bytes, want 90", len(b))
	}
	if st, _, err := s.ResponseHead(); st != 200 || err != nil {
		t.Fatal(st, err)
	}
	s.Release()
	cc.Close()
	clientWaitChan(t, done, "raw peer")
}

func TestClientWindowUpdateOverflow(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
			id := p.request()
			p.fr.WriteWindowUpdate(id, 1<<31-1)
			if code := p.waitRST(); code != int64(http2.ErrCodeFlowControl) {
				t.Errorf("RST_STREAM code %d, want FLOW_CONTROL_ERROR", code)
			}
		})
		cc := clientDial(t, addr, nil)
		_, _, _, _, err := clientRoundTrip(t, cc, &RequestHead{Method: "POST", Scheme: "http", Authority: "t", Path: "/"})
		var se *ClientStreamError
		if !errors.As(err, &se) || se.Code != http2.ErrCodeFlowControl {
			t.Fatalf("stream window overflow: %v", err)
		}
		clientWaitChan(t, done, "raw peer")
	})
	t.Run("connection", func(t *testing.T) {
		addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
			p.fr.WriteWindowUpdate(0, 1<<31-1)
			if code := p.waitGoAway(); code != int64(http2.ErrCodeFlowControl) {
				t.Errorf("GOAWAY code %d, want FLOW_CONTROL_ERROR", code)
			}
		})
		cc := clientDial(t, addr, nil)
		err := clientWaitDone(t, cc)
		if code, ok := clientConnErrCode(err); !ok || code != http2.ErrCodeFlowControl {
			t.Fatalf("connection window overflow: %v", err)
		}
		clientWaitChan(t, done, "raw peer")
	})
}

func TestClientReceiveWindowsEnforced(t *testing.T) {
	cfg := &ClientConfig{StreamWindow: 65535, ConnWindow: 65535 * 4}
	t.Run("stream", func(t *testing.T) {
		addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
			id := p.request()
			p.headers(id, false, ":status", "200")
			chunk := make([]byte, 16384)
			for i := 0; i < 5; i++ { // 81920 > 65535
				p.fr.WriteData(id, false, chunk)
			}
			if code := p.waitRST(); code != int64(http2.ErrCodeFlowControl) {
				t.Errorf("RST_STREAM code %d, want FLOW_CONTROL_ERROR", code)
			}
		})
		cc := clientDial(t, addr, cfg)
		s, err := cc.OpenStream(clientGET)
		if err != nil {
			t.Fatal(err)
		}
		clientWaitChan(t, done, "raw peer")
		_, err = io.ReadAll(s)
		var se *ClientStreamError
		if !errors.As(err, &se) || se.Code != http2.ErrCodeFlowControl || se.Remote {
			t.Fatalf("peer overran our stream window: %v", err)
		}
		s.Release()
	})
	t.Run("connection", func(t *testing.T) {
		addr, done := clientStartRawPeer(t, []http2.Setting{{ID: http2.SettingMaxFrameSize, Val: 16384}}, nil, func(p *clientRawPeer) {
			chunk := make([]byte, 16384)
			for i := 0; i < 6; i++ { // 6 × 49152 > the 262140 connection window
				id := p.request()
				p.headers(id, false, ":status", "200")
				for j := 0; j < 3; j++ { // 49152 per stream: under its window
					p.fr.WriteData(id, false, chunk)
				}
			}
			if code := p.waitGoAway(); code != int64(http2.ErrCodeFlowControl) {
				t.Errorf("GOAWAY code %d, want FLOW_CONTROL_ERROR", code)
			}
		})
		cc := clientDial(t, addr, cfg)
		for i := 0; i < 6; i++ {
			s, err := cc.OpenStream(clientGET)
			if err != nil {
				break
			}
			defer s.Release()
		}
		err := clientWaitDone(t, cc)
		if code, ok := clientConnErrCode(err); !ok || code != http2.ErrCodeFlowControl {
			t.Fatalf("peer overran our connection window (nothing read): %v", err)
		}
		clientWaitChan(t, done, "raw peer")
	})
}

func TestClientContinuationFlood(t *testing.T) {
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		id := p.request()
		p.eb.Reset()
		p.enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.eb.Bytes(), EndHeaders: false})
		for i := 0; i < 1_000_000; i++ {
			if err := p.fr.WriteContinuation(id, false, nil); err != nil {
				return
			}
		}
		t.Errorf("client took a million empty CONTINUATION frames")
	})
	cc := clientDial(t, addr, nil)
	s, err := cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ResponseHead(); err == nil {
		t.Fatal("endless CONTINUATION: got a response head")
	}
	err = clientWaitDone(t, cc)
	if code, ok := clientConnErrCode(err); !ok || code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("CONTINUATION flood: %v, want ENHANCE_YOUR_CALM", err)
	}
	clientWaitChan(t, done, "raw peer")
}

// Oversized header lists, plain or as an HPACK bomb (one big dynamic
// table entry referenced a thousand times): a stream error, the
// connection stays in service.
func TestClientOversizedResponseHeaders(t *testing.T) {
	for _, kind := range []string{"many fields", "hpack bomb"} {
		t.Run(kind, func(t *testing.T) {
			addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
				id := p.request()
				p.eb.Reset()
				p.enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
				if kind == "many fields" {
					for i := 0; i < 150; i++ { // ~14 kB compressed: one frame, 21 kB decoded
						p.enc.WriteField(hpack.HeaderField{Name: "x-filler", Value: strings.Repeat("v", 100) + string(rune('a'+i%26)), Sensitive: true})
					}
				} else {
					big := hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", 3000)}
					for i := 0; i < 1000; i++ {
						p.enc.WriteField(big) // indexed after the first: 1 byte each
					}
				}
				if p.eb.Len() > 64<<10 {
					t.Errorf("test block %d bytes: over the compressed bound, not testing the decoded one", p.eb.Len())
				}
				p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.eb.Bytes(), EndHeaders: true})
				if code := p.waitRST(); code != int64(http2.ErrCodeProtocol) {
					t.Errorf("RST_STREAM code %d, want PROTOCOL_ERROR", code)
				}
				id = p.request()
				p.headers(id, true, ":status", "204")
				p.waitGoAway()
			})
			cc := clientDial(t, addr, &ClientConfig{MaxHeaderListSize: 16 << 10, MaxResponseHeaderBytes: 64 << 10})
			_, _, _, _, err := clientRoundTrip(t, cc, clientGET)
			if !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("oversized response headers: %v, want ErrMalformedResponse", err)
			}
			if st, _, _, _, err := clientRoundTrip(t, cc, clientGET); st != 204 || err != nil {
				t.Fatalf("next request on the same connection: %d %v", st, err)
			}
			cc.Close()
			clientWaitChan(t, done, "raw peer")
		})
	}
}

// Malformed responses are stream errors (RST_STREAM PROTOCOL_ERROR) and
// never reach the caller as a response.
func TestClientMalformedResponses(t *testing.T) {
	type step func(p *clientRawPeer, id uint32)
	hdr := func(end bool, kv ...string) step {
		return func(p *clientRawPeer, id uint32) { p.headers(id, end, kv...) }
	}
	data := func(end bool, s string) step {
		return func(p *clientRawPeer, id uint32) { p.fr.WriteData(id, end, []byte(s)) }
	}
	cases := []struct {
		name   string
		steps  []step
		atHead bool // the error comes from ResponseHead (else from Read)
		method string
	}{
		{"no :status", []step{hdr(true, "server", "x")}, true, ""},
		{"two-digit :status", []step{hdr(true, ":status", "20")}, true, ""},
		{"status 101", []step{hdr(true, ":status", "101")}, true, ""},
		{"request pseudo-header", []step{hdr(true, ":status", "200", ":path", "/")}, true, ""},
		{"pseudo after regular", []step{hdr(true, "server", "x", ":status", "200")}, true, ""},
		{"upper-case name", []step{hdr(true, ":status", "200", "Server", "x")}, true, ""},
		{"connection field", []step{hdr(true, ":status", "200", "connection", "close")}, true, ""},
		{"transfer-encoding", []step{hdr(true, ":status", "200", "transfer-encoding", "chunked")}, true, ""},
		{"CR in value", []step{hdr(true, ":status", "200", "x-a", "a\r\nx-b: b")}, true, ""},
		{"conflicting content-length", []step{hdr(true, ":status", "200", "content-length", "1", "content-length", "2")}, true, ""},
		{"content-length on END_STREAM head", []step{hdr(true, ":status", "200", "content-length", "5")}, true, ""},
		{"1xx with END_STREAM", []step{hdr(true, ":status", "103")}, true, ""},
		{"DATA before HEADERS", []step{data(true, "x")}, true, ""},
		{"short body", []step{hdr(false, ":status", "200", "content-length", "5"), data(true, "abc")}, false, ""},
		{"long body", []step{hdr(false, ":status", "200", "content-length", "2"), data(true, "abcdef")}, false, ""},
		{"body on HEAD", []step{hdr(false, ":status", "200"), data(true, "abc")}, false, "HEAD"},
		{"body on 204", []step{hdr(false, ":status", "204"), data(true, "abc")}, false, ""},
		{"pseudo in trailers", []step{hdr(false, ":status", "200"), hdr(true, ":status", "200")}, false, ""},
		{"trailers without END_STREAM", []step{hdr(false, ":status", "200"), hdr(false, "grpc-status", "0")}, false, ""},
		{"trailers short of content-length", []step{hdr(false, ":status", "200", "content-length", "3"), data(false, "a"), hdr(true, "x", "y")}, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
				id := p.request()
				for _, st := range c.steps {
					st(p, id)
				}
				if code := p.waitRST(); code != int64(http2.ErrCodeProtocol) {
					t.Errorf("RST_STREAM code %d, want PROTOCOL_ERROR", code)
				}
				// The connection still serves a good response.
				id = p.request()
				p.headers(id, false, ":status", "200", "content-length", "2")
				p.fr.WriteData(id, true, []byte("ok"))
				p.waitGoAway()
			})
			cc := clientDial(t, addr, nil)
			h := *clientGET
			if c.method != "" {
				h.Method = c.method
			}
			s, err := cc.OpenStream(&h)
			if err != nil {
				t.Fatal(err)
			}
			st, _, err := s.ResponseHead()
			if c.atHead && !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("ResponseHead: status %d, %v; want ErrMalformedResponse", st, err)
			}
			if err == nil {
				// The head was fine; the body breaks it. (When the peer's
				// frames all arrived first, ResponseHead already says so.)
				b, err := io.ReadAll(s)
				if !errors.Is(err, ErrMalformedResponse) {
					t.Fatalf("Read: %q, %v; want ErrMalformedResponse", b, err)
				}
			} else if !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("ResponseHead: %v; want ErrMalformedResponse", err)
			}
			s.Release()
			if st, _, body, _, err := clientRoundTrip(t, cc, clientGET); st != 200 || string(body) != "ok" || err != nil {
				t.Fatalf("next stream: %d %q %v", st, body, err)
			}
			cc.Close()
			clientWaitChan(t, done, "raw peer")
		})
	}
}

func TestClientInformationalAndTrailers(t *testing.T) {
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		id := p.request()
		p.headers(id, false, ":status", "100")
		p.headers(id, false, ":status", "103", "link", "</a.css>; rel=preload")
		p.headers(id, false, ":status", "200", "content-type", "application/grpc")
		p.fr.WriteData(id, false, []byte("msg"))
		p.headers(id, true, "grpc-status", "0", "grpc-message", "")
		p.waitGoAway()
	})
	cc := clientDial(t, addr, nil)
	var seen []int
	s, err := cc.OpenStream(&RequestHead{Method: "POST", Scheme: "http", Authority: "t", Path: "/", EndStream: true,
		Informational: func(status int, f []hpack.HeaderField) { seen = append(seen, status) }})
	if err != nil {
		t.Fatal(err)
	}
	st, f, err := s.ResponseHead()
	if err != nil || st != 200 || clientField(f, "content-type") != "application/grpc" {
		t.Fatal(st, f, err)
	}
	b, err := io.ReadAll(s)
	if err != nil || string(b) != "msg" {
		t.Fatal(string(b), err)
	}
	if gs := clientField(s.Trailers(), "grpc-status"); gs != "0" {
		t.Fatalf("grpc-status trailer %q (trailers %v)", gs, s.Trailers())
	}
	if len(seen) != 2 || seen[0] != 100 || seen[1] != 103 {
		t.Fatalf("informational responses %v, want [100 103]", seen)
	}
	s.Release()
	cc.Close()
	clientWaitChan(t, done, "raw peer")
}

func TestClientStreamIDExhaustion(t *testing.T) {
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		id := p.request()
		if id != clientMaxStreamID {
			t.Errorf("stream id %d, want %d", id, clientMaxStreamID)
		}
		p.headers(id, true, ":status", "204")
		if code := p.waitGoAway(); code != int64(http2.ErrCodeNo) {
			t.Errorf("GOAWAY code %d, want NO_ERROR once the last id is used", code)
		}
	})
	cc := clientDial(t, addr, nil)
	cc.mu.Lock()
	cc.nextID = clientMaxStreamID // as if 2^30 streams had gone before
	cc.mu.Unlock()
	s, err := cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	if cc.CanTakeNewStream() {
		t.Fatal("CanTakeNewStream with stream ids exhausted")
	}
	if _, err := cc.OpenStream(clientGET); !IsRetrySafe(err) {
		t.Fatalf("OpenStream past the last id: %v, want retry-safe", err)
	}
	if st, _, err := s.ResponseHead(); st != 204 || err != nil {
		t.Fatal(st, err)
	}
	s.Release()
	clientWaitDone(t, cc)
	clientWaitChan(t, done, "raw peer")
}

func TestClientPingTimeout(t *testing.T) {
	addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		// Read and ignore everything: PINGs go unanswered.
		for p.next() != nil {
		}
	})
	cc := clientDial(t, addr, &ClientConfig{ReadIdleTimeout: 30 * time.Millisecond, PingTimeout: 100 * time.Millisecond})
	if err := clientWaitDone(t, cc); !errors.Is(err, ErrPingTimeout) {
		t.Fatalf("unanswered ping: %v, want ErrPingTimeout", err)
	}
	clientWaitChan(t, done, "raw peer")
}

func TestClientRejectsBadPeers(t *testing.T) {
	cases := []struct {
		name   string
		script func(p *clientRawPeer)
		code   http2.ErrCode
	}{
		{"push promise", func(p *clientRawPeer) {
			id := p.request()
			p.eb.Reset()
			p.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "GET"})
			p.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, BlockFragment: p.eb.Bytes(), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		// Each script reads the client's request first: a peer that
		// misbehaves before it may have the connection closed before
		// the test opens its stream (8 failures in 30 runs with -race).
		{"headers on idle stream", func(p *clientRawPeer) {
			p.request()
			p.headers(7, true, ":status", "200")
		}, http2.ErrCodeProtocol},
		{"enable push", func(p *clientRawPeer) {
			p.request()
			p.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 1})
		}, http2.ErrCodeProtocol},
		{"frame over our max size", func(p *clientRawPeer) {
			id := p.request()
			p.headers(id, false, ":status", "200")
			p.fr.WriteData(id, false, make([]byte, 20000))
		}, http2.ErrCodeFrameSize},
		{"HPACK garbage", func(p *clientRawPeer) {
			id := p.request()
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr, done := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
				c.script(p)
				if code := p.waitGoAway(); code != int64(c.code) {
					t.Errorf("client's GOAWAY code %d, want %v", code, c.code)
				}
			})
			cc := clientDial(t, addr, nil)
			s, err := cc.OpenStream(clientGET)
			if err != nil {
				t.Fatal(err)
			}
			err = clientWaitDone(t, cc)
			if code, ok := clientConnErrCode(err); !ok || code != c.code {
				t.Fatalf("%s: %v, want a connection error %v", c.name, err, c.code)
			}
			_, _, err = s.ResponseHead()
			if err == nil {
				_, err = io.ReadAll(s)
			}
			if err == nil || IsRetrySafe(err) {
				t.Fatalf("stream on a connection killed by a protocol error: %v (want an error, not retry-safe)", err)
			}
			s.Release()
			clientWaitChan(t, done, "raw peer")
		})
	}
}

// A caller that never reads: the peer is stopped by our windows, memory
// holds at most the stream window.
func TestClientUnreadBodyIsBounded(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(clientTestHandler))
	cc := clientDial(t, addr, &ClientConfig{StreamWindow: 65535})
	s, err := cc.OpenStream(&RequestHead{Method: "GET", Scheme: "http", Authority: "t", Path: "/big?n=10000000", EndStream: true})
	if err != nil {
		t.Fatal(err)
	}
	if st, _, err := s.ResponseHead(); st != 200 || err != nil {
		t.Fatal(st, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	buffered := 0
	for time.Now().Before(deadline) {
		cc.mu.Lock()
		buffered = len(s.buf) - s.off
		cc.mu.Unlock()
		if buffered == 65535 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if buffered != 65535 {
		t.Fatalf("unread body buffered %d bytes, want exactly the stream window 65535", buffered)
	}
	// Let the window fill further for a moment: it must not grow.
	time.Sleep(100 * time.Millisecond)
	cc.mu.Lock()
	buffered = len(s.buf) - s.off
	cc.mu.Unlock()
	if buffered > 65535 {
		t.Fatalf("unread body grew to %d bytes past the window", buffered)
	}
	// Reading it all gives the credit back and the whole body arrives.
	n, err := io.Copy(io.Discard, s)
	if err != nil || n != 10000000 {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	s.Release()
}

// clientWaitPeerSettings waits (bounded) until the peer's SETTINGS are
// applied, as cond (run under cc.mu) says.
func clientWaitPeerSettings(tb testing.TB, cc *ClientConn, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(clientTestTimeout)
	for {
		cc.mu.Lock()
		ok := cond()
		cc.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("peer's SETTINGS not applied in time")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClientShutdownLetsStreamsFinish(t *testing.T) {
	addr2, done2 := clientStartRawPeer(t, nil, nil, func(p *clientRawPeer) {
		id := p.request()
		p.fr.WritePing(false, [8]byte{1}) // a round trip: Shutdown ran by the time the ACK is back
		p.waitFor(func(f http2.Frame) bool { pf, ok := f.(*http2.PingFrame); return ok && pf.IsAck() })
		p.headers(id, false, ":status", "200", "content-length", "4")
		p.fr.WriteData(id, true, []byte("done"))
		if code := p.waitGoAway(); code != int64(http2.ErrCodeNo) {
			t.Errorf("GOAWAY code %d after the last stream, want NO_ERROR", code)
		}
	})
	cc := clientDial(t, addr2, nil)
	s, err := cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	cc.Shutdown()
	if cc.CanTakeNewStream() {
		t.Fatal("CanTakeNewStream after Shutdown")
	}
	if _, err := cc.OpenStream(clientGET); !IsRetrySafe(err) {
		t.Fatalf("OpenStream after Shutdown: %v, want retry-safe", err)
	}
	st, _, err := s.ResponseHead()
	body, rerr := io.ReadAll(s)
	if st != 200 || err != nil || string(body) != "done" || rerr != nil {
		t.Fatalf("stream in flight across Shutdown: %d %q %v %v", st, body, err, rerr)
	}
	s.Release()
	if err := clientWaitDone(t, cc); !errors.Is(err, ErrClientConnClosed) {
		t.Fatalf("after Shutdown drained: %v, want ErrClientConnClosed", err)
	}
	clientWaitChan(t, done2, "raw peer")

	// An idle connection closes at once.
	idle := clientDial(t, clientXNetServer(t, http.HandlerFunc(clientTestHandler)), nil)
	idle.Shutdown()
	if err := clientWaitDone(t, idle); !errors.Is(err, ErrClientConnClosed) {
		t.Fatalf("idle Shutdown: %v", err)
	}
}

// Closed connections leave no goroutine behind (read loop, control
// writer, timers).
func TestClientNoGoroutineLeak(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(clientTestHandler))
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := NewClientConn(c, &ClientConfig{ReadIdleTimeout: time.Second, IdleTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if st, _, _, _, err := clientRoundTrip(t, cc, clientGET); st != 200 || err != nil {
			t.Fatal(st, err)
		}
		cc.Close()
		<-cc.Done()
	}
	deadline := time.Now().Add(clientTestTimeout)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Fatalf("%d goroutines after closing 20 connections, %d before", n, before)
	}
}
