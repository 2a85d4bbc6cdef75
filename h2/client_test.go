package h2

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// clientTestHandler: /echo echoes the body and its sha256 in a trailer;
// /big?n= writes n bytes; anything else says hello.
func clientTestHandler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/echo":
		w.Header().Set("Trailer", "X-Sum")
		h := sha256.New()
		io.Copy(io.MultiWriter(w, h), r.Body)
		w.Header().Set("X-Sum", fmt.Sprintf("%x", h.Sum(nil)))
	case "/big":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := bytes.Repeat([]byte("x"), 32<<10)
		for n > 0 {
			m := min(n, len(chunk))
			if _, err := w.Write(chunk[:m]); err != nil {
				return
			}
			n -= m
		}
	default:
		w.Header().Set("X-Seen-Host", r.Host)
		io.WriteString(w, "hello "+r.Method)
	}
}

func TestClientAgainstXNetServerH2C(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(clientTestHandler))
	cc := clientDial(t, addr, nil)

	status, fields, body, _, err := clientRoundTrip(t, cc, &RequestHead{Method: "GET", Scheme: "http", Authority: "example.test", Path: "/", EndStream: true})
	if err != nil || status != 200 || string(body) != "hello GET" || clientField(fields, "x-seen-host") != "example.test" {
		t.Fatalf("GET: status %d body %q host %q err %v", status, body, clientField(fields, "x-seen-host"), err)
	}

	// A body larger than every window, streamed: flow control both ways,
	// and the trailer the server computes from what arrived.
	payload := bytes.Repeat([]byte("0123456789abcdef"), 300_000/16) // 300 kB > 64 kB windows
	s, err := cc.OpenStream(&RequestHead{Method: "POST", Scheme: "http", Authority: "t", Path: "/echo",
		Fields: []hpack.HeaderField{{Name: "content-type", Value: "application/octet-stream"}}})
	if err != nil {
		t.Fatal(err)
	}
	writeErr := make(chan error, 1)
	go func() {
		_, err := s.Write(payload)
		if err == nil {
			err = s.CloseSend()
		}
		writeErr <- err
	}()
	status, _, err = s.ResponseHead()
	if err != nil || status != 200 {
		t.Fatalf("echo head: %d %v", status, err)
	}
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("echo body: %d bytes (want %d), err %v", len(got), len(payload), err)
	}
	if err := <-writeErr; err != nil {
		t.Fatalf("echo write: %v", err)
	}
	want := fmt.Sprintf("%x", sha256.Sum256(payload))
	if sum := clientField(s.Trailers(), "x-sum"); sum != want {
		t.Fatalf("trailer x-sum %q, want %q (trailers %v)", sum, want, s.Trailers())
	}
	s.Release()

	// A buffered body goes with OpenStream, in one write.
	status, _, body, tr, err := clientRoundTrip(t, cc, &RequestHead{Method: "POST", Scheme: "http", Authority: "t", Path: "/echo", Body: []byte("buffered"), EndStream: true})
	if err != nil || status != 200 || string(body) != "buffered" || clientField(tr, "x-sum") != fmt.Sprintf("%x", sha256.Sum256([]byte("buffered"))) {
		t.Fatalf("buffered POST: %d %q %v %v", status, body, tr, err)
	}

	// Many concurrent streams, more than the default 100 at once would
	// need: the pool's job is CanTakeNewStream, ours is to refuse with a
	// retryable error, never to break.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := 1000 + i*1000
			status, _, body, _, err := clientRoundTrip(t, cc, &RequestHead{Method: "GET", Scheme: "http", Authority: "t", Path: "/big?n=" + strconv.Itoa(n), EndStream: true})
			if err != nil || status != 200 || len(body) != n {
				errs <- fmt.Errorf("stream %d: status %d, %d bytes of %d, %v", i, status, len(body), n, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := cc.ActiveStreams(); n != 0 {
		t.Fatalf("%d streams still active after all ended", n)
	}
}

func TestClientAgainstXNetServerTLS(t *testing.T) {
	cert, pool := clientTestCert(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					c.Close()
					return
				}
				(&http2.Server{}).ServeConn(tc, &http2.ServeConnOpts{Handler: http.HandlerFunc(clientTestHandler)})
			}()
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN negotiated %q, want h2", p)
	}
	cc, err := NewClientConn(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for i := 0; i < 3; i++ {
		status, _, body, _, err := clientRoundTrip(t, cc, &RequestHead{Method: "GET", Scheme: "https", Authority: "127.0.0.1", Path: "/big?n=200000", EndStream: true})
		if err != nil || status != 200 || len(body) != 200000 {
			t.Fatalf("TLS GET %d: status %d, %d bytes, %v", i, status, len(body), err)
		}
	}
}

// clientGRPCUnary sends one unary call as raw HTTP/2 and returns the
// response message bytes and the trailers.
func clientGRPCUnary(t *testing.T, cc *ClientConn, method string, req proto.Message) ([]byte, []hpack.HeaderField) {
	t.Helper()
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	copy(body[5:], msg)
	status, fields, resp, trailers, err := clientRoundTrip(t, cc, &RequestHead{Method: "POST", Scheme: "http", Authority: "grpc.test", Path: method,
		Fields: []hpack.HeaderField{{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}},
		Body:   body, EndStream: true})
	if err != nil || status != 200 {
		t.Fatalf("%s: status %d err %v", method, status, err)
	}
	if ct := clientField(fields, "content-type"); ct != "application/grpc" {
		t.Fatalf("%s: content-type %q", method, ct)
	}
	if len(resp) == 0 {
		return nil, trailers
	}
	if len(resp) < 5 || int(binary.BigEndian.Uint32(resp[1:5])) != len(resp)-5 {
		t.Fatalf("%s: bad length-prefixed message %x", method, resp)
	}
	return resp[5:], trailers
}

func TestClientAgainstGRPCServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("hotproxy.test", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	cc := clientDial(t, ln.Addr().String(), nil)
	for i := 0; i < 3; i++ { // more than one: the HPACK dynamic table in use
		msg, trailers := clientGRPCUnary(t, cc, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{Service: "hotproxy.test"})
		var resp healthpb.HealthCheckResponse
		if err := proto.Unmarshal(msg, &resp); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call %d: response %v, %v", i, resp.Status, err)
		}
		if gs := clientField(trailers, "grpc-status"); gs != "0" {
			t.Fatalf("call %d: grpc-status %q in trailers %v, want 0", i, gs, trailers)
		}
	}
	// An unknown service: NOT_FOUND (5), carried in the trailers (or a
	// trailers-only response, which is the head with END_STREAM).
	_, trailers := clientGRPCUnary(t, cc, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{Service: "nope"})
	if gs := clientField(trailers, "grpc-status"); gs != "5" {
		t.Logf("trailers %v", trailers)
		// trailers-only: grpc-status sits in the head; look there too.
		s, err := cc.OpenStream(&RequestHead{Method: "POST", Scheme: "http", Authority: "g", Path: "/grpc.health.v1.Health/Check",
			Fields: []hpack.HeaderField{{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}},
			Body:   []byte{0, 0, 0, 0, 6, 10, 4, 'n', 'o', 'p', 'e'}, EndStream: true})
		if err != nil {
			t.Fatal(err)
		}
		_, f, err := s.ResponseHead()
		if err != nil || clientField(f, "grpc-status") != "5" {
			t.Fatalf("unknown service: grpc-status %q (head %v, err %v), want 5", clientField(f, "grpc-status"), f, err)
		}
		s.Release()
	}

	// Graceful stop: GOAWAY, the connection ends, nothing new is taken.
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	clientWaitDone(t, cc)
	clientWaitChan(t, stopped, "grpc GracefulStop")
	if cc.CanTakeNewStream() {
		t.Fatal("CanTakeNewStream after the server went away")
	}
	if _, err := cc.OpenStream(clientGET); !IsRetrySafe(err) {
		t.Fatalf("OpenStream on a dead connection: %v, want a retry-safe refusal", err)
	}
}

func TestClientHealthPingKeepsAliveAndIdleTimeoutCloses(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(clientTestHandler))
	// Dead runs just after Done closes (fail: the pool relies on that
	// order), so it is waited for, not read at Done.
	dead := make(chan error, 1)
	cc := clientDial(t, addr, &ClientConfig{ReadIdleTimeout: 20 * time.Millisecond, PingTimeout: 5 * time.Second, IdleTimeout: 400 * time.Millisecond,
		Events: ClientEvents{Dead: func(err error) { dead <- err }}})
	if _, _, _, _, err := clientRoundTrip(t, cc, clientGET); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := clientWaitDone(t, cc)
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("closed after %v, before the 400ms idle timeout", el)
	}
	if err == nil || !errors.Is(err, ErrClientConnClosed) {
		t.Fatalf("idle close: %v, want ErrClientConnClosed (pings answered, so no ping timeout)", err)
	}
	select {
	case got := <-dead:
		if got != err {
			t.Fatalf("Events.Dead got %v, Err %v", got, err)
		}
	case <-time.After(clientTestTimeout):
		t.Fatalf("Events.Dead not called within %v of Done", clientTestTimeout)
	}
}

func TestClientCloseUnblocksReaders(t *testing.T) {
	release := make(chan struct{})
	addr := clientXNetServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer close(release)
	cc := clientDial(t, addr, nil)
	s, err := cc.OpenStream(clientGET)
	if err != nil {
		t.Fatal(err)
	}
	if st, _, err := s.ResponseHead(); err != nil || st != 200 {
		t.Fatal(st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clientTestTimeout)
	defer cancel()
	got := make(chan error, 1)
	go func() { _, err := s.Read(make([]byte, 10)); got <- err }()
	time.AfterFunc(50*time.Millisecond, func() { cc.Close() })
	select {
	case err := <-got:
		if !errors.Is(err, ErrClientConnClosed) {
			t.Fatalf("Read after Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Read still blocked after Close")
	}
}

// A head that cannot be HTTP/2 is refused before anything is sent, and
// is not retry-safe: another connection would refuse it too.
func TestClientRejectsInvalidRequestHeads(t *testing.T) {
	addr := clientXNetServer(t, http.HandlerFunc(clientTestHandler))
	cc := clientDial(t, addr, nil)
	base := func(f ...hpack.HeaderField) *RequestHead {
		return &RequestHead{Method: "GET", Scheme: "http", Authority: "t", Path: "/", Fields: f, EndStream: true}
	}
	cases := map[string]*RequestHead{
		"space in method":           {Method: "G T", Scheme: "http", Path: "/", EndStream: true},
		"empty method":              {Scheme: "http", Path: "/", EndStream: true},
		"no path":                   {Method: "GET", Scheme: "http", EndStream: true},
		"CONNECT without authority": {Method: "CONNECT", EndStream: true},
		"CRLF in path":              {Method: "GET", Scheme: "http", Path: "/\r\nx: y", EndStream: true},
		"upper-case name":           base(hpack.HeaderField{Name: "Accept", Value: "*/*"}),
		"connection field":          base(hpack.HeaderField{Name: "connection", Value: "keep-alive"}),
		"transfer-encoding":         base(hpack.HeaderField{Name: "transfer-encoding", Value: "chunked"}),
		"te other than trailers":    base(hpack.HeaderField{Name: "te", Value: "gzip"}),
		"pseudo in fields":          base(hpack.HeaderField{Name: ":path", Value: "/x"}),
		"LF in value":               base(hpack.HeaderField{Name: "x-a", Value: "a\nb"}),
	}
	for name, h := range cases {
		if _, err := cc.OpenStream(h); !errors.Is(err, ErrInvalidRequestHead) || IsRetrySafe(err) {
			t.Errorf("%s: %v, want ErrInvalidRequestHead, not retry-safe", name, err)
		}
	}
	// Nothing went out: the first real request is stream 1.
	s, err := cc.OpenStream(base(hpack.HeaderField{Name: "te", Value: "trailers"}))
	if err != nil || s.ID() != 1 {
		t.Fatalf("first valid request: id %d, %v", s.ID(), err)
	}
	if st, _, err := s.ResponseHead(); st != 200 || err != nil {
		t.Fatal(st, err)
	}
	s.Release()
}
