package h2

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientBenchPeer is an allocation-free HTTP/2 server for benchmarks:
// for every request that ends, one write of a pre-encoded response
// (HEADERS ":status 200" from the static table, DATA "hello" with
// END_STREAM). It never decodes the request headers, so it measures our
// side only (b.ReportAllocs counts every goroutine of the process).
func clientBenchPeer(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go clientBenchServe(c)
		}
	}()
	return ln.Addr().String()
}

func clientBenchServe(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	if _, err := br.Discard(len(clientPreface)); err != nil {
		return
	}
	out := clientAppendSettings(nil, nil)
	if _, err := c.Write(out); err != nil {
		return
	}
	var w []byte
	respond := func(id uint32) {
		w = clientAppendFrameHeader(w, 1, http2.FrameHeaders, http2.FlagHeadersEndHeaders, id)
		w = append(w, 0x88) // indexed :status 200
		w = clientAppendData(w, id, true, []byte("hello"))
	}
	var hdr [9]byte
	payload := make([]byte, 1<<20)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		t, flags := http2.FrameType(hdr[3]), http2.Flags(hdr[4])
		id := (uint32(hdr[5])<<24 | uint32(hdr[6])<<16 | uint32(hdr[7])<<8 | uint32(hdr[8])) & 0x7fffffff
		if _, err := io.ReadFull(br, payload[:n]); err != nil {
			return
		}
		switch t {
		case http2.FrameSettings:
			if !flags.Has(http2.FlagSettingsAck) {
				w = clientAppendSettingsAck(w)
			}
		case http2.FrameHeaders:
			if flags.Has(http2.FlagHeadersEndStream) {
				respond(id)
			}
		case http2.FrameData:
			if flags.Has(http2.FlagDataEndStream) {
				respond(id)
			}
			if n > 0 {
				w = clientAppendWindowUpdate(w, 0, uint32(n))
				w = clientAppendWindowUpdate(w, id, uint32(n))
			}
		case http2.FramePing:
			if !flags.Has(http2.FlagPingAck) {
				w = clientAppendPing(w, true, [8]byte(payload[:8]))
			}
		}
		if br.Buffered() == 0 && len(w) > 0 {
			if _, err := c.Write(w); err != nil {
				return
			}
			w = w[:0]
		}
	}
}

var clientBenchFields = []hpack.HeaderField{
	{Name: "user-agent", Value: "hotproxy-bench"},
	{Name: "accept", Value: "*/*"},
	{Name: "x-request-id", Value: "0123456789abcdef"},
}

// clientBenchExchange runs one request to its last byte.
func clientBenchExchange(tb testing.TB, cc *ClientConn, h *RequestHead, buf []byte) {
	s, err := cc.OpenStream(h)
	if err != nil {
		tb.Fatal(err)
	}
	if st, _, err := s.ResponseHead(); err != nil || st != 200 {
		tb.Fatal(st, err)
	}
	n := 0
	for {
		m, err := s.Read(buf)
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	if n == 0 {
		tb.Fatal("empty body")
	}
	s.Release()
}

func benchmarkClient(b *testing.B, addr string, h *RequestHead) {
	cc := clientDial(b, addr, nil)
	buf := make([]byte, 4096)
	for i := 0; i < 100; i++ { // warm the HPACK tables and pools
		clientBenchExchange(b, cc, h, buf)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clientBenchExchange(b, cc, h, buf)
	}
}

// BenchmarkClientGET: a GET through our client to the allocation-free
// peer: the client's own cost per request.
func BenchmarkClientGET(b *testing.B) {
	benchmarkClient(b, clientBenchPeer(b), &RequestHead{Method: "GET", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, EndStream: true})
}

// BenchmarkClientPOSTBuffered: a buffered 1 kB body, sent with the
// HEADERS in one write.
func BenchmarkClientPOSTBuffered(b *testing.B) {
	body := make([]byte, 1024)
	benchmarkClient(b, clientBenchPeer(b), &RequestHead{Method: "POST", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, Body: body, EndStream: true})
}

// BenchmarkClientXNetServer: the same GET against x/net's http2.Server
// (its allocations count too).
func BenchmarkClientXNetServer(b *testing.B) {
	addr := clientXNetServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	benchmarkClient(b, addr, &RequestHead{Method: "GET", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, EndStream: true})
}

// TestClientSteadyStateAllocations holds the client to its allocation
// budget per request against the allocation-free peer.
func TestClientSteadyStateAllocations(t *testing.T) {
	if clientRaceEnabled {
		t.Skip("allocation counts are meaningless under -race (run without -race: go test -run TestClientSteadyStateAllocations ./h2)")
	}
	cc := clientDial(t, clientBenchPeer(t), nil)
	buf := make([]byte, 4096)
	for _, h := range []*RequestHead{
		{Method: "GET", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, EndStream: true},
		{Method: "POST", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, Body: make([]byte, 1024), EndStream: true},
	} {
		for i := 0; i < 100; i++ {
			clientBenchExchange(t, cc, h, buf)
		}
		allocs := testing.AllocsPerRun(200, func() { clientBenchExchange(t, cc, h, buf) })
		if allocs > clientAllocBudget {
			t.Errorf("%s: %.1f allocations per request, budget %d", h.Method, allocs, clientAllocBudget)
		}
	}
}

// clientAllocBudget is what one request may allocate in the steady
// state, on every goroutine of the process (read loop included).
const clientAllocBudget = 0

// BenchmarkClientGETParallel: concurrent streams multiplexed on one
// connection.
func BenchmarkClientGETParallel(b *testing.B) {
	cc := clientDial(b, clientBenchPeer(b), nil)
	h := &RequestHead{Method: "GET", Scheme: "http", Authority: "bench.test", Path: "/x", Fields: clientBenchFields, EndStream: true}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			clientBenchExchange(b, cc, h, buf)
		}
	})
}

// BenchmarkXNetClientConnGET: x/net's ClientConn, the code ours
// replaces, on the same allocation-free peer, for comparison.
func BenchmarkXNetClientConnGET(b *testing.B) {
	c, err := net.Dial("tcp", clientBenchPeer(b))
	if err != nil {
		b.Fatal(err)
	}
	tr := &http2.Transport{AllowHTTP: true}
	xc, err := tr.NewClientConn(c)
	if err != nil {
		b.Fatal(err)
	}
	defer xc.Close()
	req, _ := http.NewRequest("GET", "http://bench.test/x", nil)
	for _, f := range clientBenchFields {
		req.Header.Set(f.Name, f.Value)
	}
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := xc.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				break
			}
		}
		resp.Body.Close()
	}
}
