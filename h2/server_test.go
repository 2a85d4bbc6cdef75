package h2

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2cClient is x/net's Transport speaking h2c with prior knowledge.
func h2cClient() *http.Client {
	return &http.Client{Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}, Timeout: 30 * time.Second}
}

// A body larger than MaxRequestBodyBuffer streams through Read with flow
// control, and a response larger than every window arrives whole.
func TestStreamingBodiesBothWays(t *testing.T) {
	h := HandlerFunc(func(st *Stream) {
		if _, complete := st.Body(); complete {
			st.WriteHeaders(500, nil, true)
			return
		}
		sum := sha256.New()
		n, err := io.Copy(sum, st)
		if err != nil {
			st.WriteHeaders(500, nil, true)
			return
		}
		st.WriteHeaders(200, []hpack.HeaderField{{Name: "x-sum", Value: hex.EncodeToString(sum.Sum(nil)[:4])}}, false)
		chunk := bytes.Repeat([]byte("r"), 32<<10)
		for sent := int64(0); sent < 3*n; sent += int64(len(chunk)) {
			if _, err := st.Write(chunk); err != nil {
				return
			}
		}
	})
	ts := startServer(t, &ServerConfig{StreamWindow: 64 << 10, MaxRequestBodyBuffer: 16 << 10}, h, nil)
	body := bytes.Repeat([]byte("q"), 1<<20)
	resp, err := h2cClient().Post("http://"+ts.addr()+"/up", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(body)
	if resp.StatusCode != 200 || resp.Header.Get("x-sum") != hex.EncodeToString(want[:4]) {
		t.Errorf("status %d x-sum %q, want 200 and the request body's sum", resp.StatusCode, resp.Header.Get("x-sum"))
	}
	if len(got) < 3<<20 || strings.Trim(string(got), "r") != "" {
		t.Errorf("response body %d bytes, want at least %d of 'r'", len(got), 3<<20)
	}
}

// Request trailers reach the handler; response trailers (grpc-status)
// reach the client.
func TestTrailersBothWays(t *testing.T) {
	h := HandlerFunc(func(st *Stream) {
		io.Copy(io.Discard, st)
		var got string
		for _, f := range st.Trailers() {
			if f.Name == "x-checksum" {
				got = f.Value
			}
		}
		st.WriteHeaders(200, []hpack.HeaderField{{Name: "content-type", Value: "application/grpc"}}, false)
		st.Write([]byte("payload"))
		st.WriteTrailers([]hpack.HeaderField{{Name: "grpc-status", Value: "0"}, {Name: "x-echo", Value: got}})
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	req, _ := http.NewRequest("POST", "http://"+ts.addr()+"/svc/Method", io.NopCloser(strings.NewReader("request")))
	req.Trailer = http.Header{"X-Checksum": {"abc123"}}
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "payload" || resp.Trailer.Get("grpc-status") != "0" || resp.Trailer.Get("x-echo") != "abc123" {
		t.Errorf("body %q trailers %v, want payload, grpc-status 0 and x-echo abc123", body, resp.Trailer)
	}
}

// CONNECT reaches the handler (the proxy answers 405 itself).
func TestConnectPassedToHandler(t *testing.T) {
	var method, authority string
	h := HandlerFunc(func(st *Stream) {
		method, authority = st.Method(), st.Authority()
		st.WriteHeaders(405, nil, true)
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	rc := dialRaw(t, ts.addr())
	rc.buf.Reset()
	rc.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	rc.enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "backend.example:443"})
	rc.headers(1, append([]byte(nil), rc.buf.Bytes()...), false)
	status, _, err := rc.readResponse(1, 10*time.Second)
	if err != nil || status != "405" || method != "CONNECT" || authority != "backend.example:443" {
		t.Errorf("CONNECT: status %q err %v, handler saw %q %q", status, err, method, authority)
	}
}

// RFC 9113 §8.3.1: :authority and host both present and different is
// malformed; equal but for case is fine.
func TestAuthorityHostRules(t *testing.T) {
	ts := startServer(t, &ServerConfig{}, answerHandler, nil)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("GET", "/", hpack.HeaderField{Name: "host", Value: "other.example"}), true)
	if _, _, err := rc.readResponse(1, 10*time.Second); err == nil || !strings.Contains(err.Error(), "PROTOCOL_ERROR") {
		t.Errorf("host differing from :authority: %v, want RST_STREAM PROTOCOL_ERROR", err)
	}
	rc.headers(3, rc.block("GET", "/", hpack.HeaderField{Name: "host", Value: "EXAMPLE.test"}), true)
	if status, _, err := rc.readResponse(3, 10*time.Second); err != nil || status != "200" {
		t.Errorf("host equal to :authority but for case: %q %v, want 200", status, err)
	}
}

// Shutdown: GOAWAY(2^31-1) and PING; after the ack GOAWAY names the last
// stream; the stream in flight finishes; a later stream is not served;
// then the connection closes.
func TestGracefulShutdown(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := HandlerFunc(func(st *Stream) {
		if st.Path() == "/slow" {
			started <- struct{}{}
			<-release
		}
		answerHandler(st)
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("GET", "/slow"), true)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not start")
	}
	ts.mu.Lock()
	sc := ts.conns[0]
	ts.mu.Unlock()
	sc.Shutdown()
	sc.Shutdown() // idempotent

	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var goaways []uint32
	for len(goaways) < 2 {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after Shutdown, got GOAWAYs %v then %v", goaways, err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %v, want NO_ERROR", f.ErrCode)
			}
			goaways = append(goaways, f.LastStreamID)
		case *http2.PingFrame:
			if !f.IsAck() {
				rc.fr.WritePing(true, f.Data)
			}
		}
	}
	if goaways[0] != maxWindow || goaways[1] != 1 {
		t.Errorf("GOAWAY last stream ids %v, want [2147483647 1]", goaways)
	}
	if n := sc.StreamsInFlight(); n != 1 {
		t.Errorf("StreamsInFlight %d during the drain, want 1", n)
	}
	rc.headers(3, rc.block("GET", "/late"), true)
	close(release)
	status, body, err := rc.readResponse(1, 10*time.Second)
	if err != nil || status != "200" || string(body) != "hello, h2\n" {
		t.Errorf("stream in flight: %q %q %v, want it to finish", status, body, err)
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			break // closed: what we wait for
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 3 {
			t.Errorf("stream 3, opened after the final GOAWAY, was served")
		}
	}
}

func TestIdleTimeoutGoAway(t *testing.T) {
	ts := startServer(t, &ServerConfig{IdleTimeout: 200 * time.Millisecond}, answerHandler, nil)
	rc := dialRaw(t, ts.addr())
	if status, _, err := rc.get(1, "/", 10*time.Second); err != nil || status != "200" {
		t.Fatalf("first request: %q %v", status, err)
	}
	res := rc.awaitGoAway(10 * time.Second)
	if !res.sawGoAway || res.code != http2.ErrCodeNo || res.lastID != 1 || !res.closed {
		t.Errorf("idle connection: %+v, want GOAWAY NO_ERROR last 1 and close", res)
	}
}

// Done is closed by the client's RST_STREAM, so a handler waiting on the
// upstream can give up.
func TestDoneOnClientReset(t *testing.T) {
	gotDone := make(chan bool, 1)
	h := HandlerFunc(func(st *Stream) {
		select {
		case <-st.Done():
			gotDone <- true
		case <-time.After(10 * time.Second):
			gotDone <- false
		}
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("GET", "/"), true)
	rc.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	if !<-gotDone {
		t.Error("Done not closed 10s after the client's RST_STREAM")
	}
}

// A request without content-length whose body has not ended is handed
// over at once: a bidirectional stream (gRPC) gets its answer to the first
// message before it sends the next.
func TestBidirectionalStreamDispatchedBeforeEnd(t *testing.T) {
	h := HandlerFunc(func(st *Stream) {
		buf := make([]byte, 16)
		n, err := st.Read(buf)
		if err != nil {
			return
		}
		st.WriteHeaders(200, nil, false)
		st.Write(append([]byte("echo:"), buf[:n]...))
		st.Flush()
		io.Copy(io.Discard, st)
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	rc := dialRaw(t, ts.addr())
	rc.headers(1, rc.block("POST", "/bidi"), false)
	rc.fr.WriteData(1, false, []byte("ping"))
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer to the first message before END_STREAM: %v", err)
		}
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
			if string(d.Data()) != "echo:ping" {
				t.Errorf("got %q, want echo:ping", d.Data())
			}
			break
		}
	}
	rc.fr.WriteData(1, true, nil)
}

// A 100 Continue head may precede the final one, and HTTP/1-style field
// names go out lowercase.
func TestInterimResponseAndFieldCase(t *testing.T) {
	h := HandlerFunc(func(st *Stream) {
		if err := st.WriteHeaders(100, nil, false); err != nil {
			st.Reset(http2.ErrCodeInternal)
			return
		}
		st.WriteHeaders(200, []hpack.HeaderField{{Name: "X-Upstream-Name", Value: "v"}}, true)
	})
	ts := startServer(t, &ServerConfig{}, h, nil)
	rc := dialRaw(t, ts.addr())
	var names []string
	rc.hd = hpack.NewDecoder(4096, func(f hpack.HeaderField) { names = append(names, f.Name+"="+f.Value) })
	rc.headers(1, rc.block("GET", "/"), true)
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after heads %v: %v", names, err)
		}
		if hf, ok := f.(*http2.HeadersFrame); ok {
			rc.hd.Write(hf.HeaderBlockFragment())
			if hf.StreamEnded() {
				break
			}
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok {
			t.Fatalf("RST_STREAM %v after heads %v", r.ErrCode, names)
		}
	}
	if got := strings.Join(names, " "); got != ":status=100 :status=200 x-upstream-name=v" {
		t.Errorf("heads %q, want 100 then 200 with x-upstream-name", got)
	}
}

// preread: the bytes the caller already read (h2c prior knowledge sniffing)
// are consumed before the socket.
func TestPrereadPrefaceBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		sniff := make([]byte, len("PRI * HTTP/2.0"))
		if _, err := io.ReadFull(c, sniff); err != nil {
			served <- err
			return
		}
		served <- NewServerConn(c, sniff, nil, answerHandler).Serve()
	}()
	rc := dialRaw(t, ln.Addr().String())
	if status, body, err := rc.get(1, "/", 10*time.Second); err != nil || status != "200" || string(body) != "hello, h2\n" {
		t.Fatalf("with preread: %q %q %v", status, body, err)
	}
	rc.c.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after the client closed: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return 10s after the client closed")
	}
}

func TestBadPreface(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	go client.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	err := NewServerConn(server, nil, nil, answerHandler).Serve()
	if !errors.Is(err, ErrBadPreface) {
		t.Errorf("Serve on an HTTP/1.1 request: %v, want ErrBadPreface", err)
	}
}
