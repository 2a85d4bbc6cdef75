package workers

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
)

// rawH2Backend is an HTTP/2 cleartext (prior knowledge) backend that
// allocates nothing per request: it reads frames by hand and answers
// every stream that ends with one pre-encoded response (:status 200,
// content-length 13, "hello, world\n"), giving the connection window
// back for request DATA. With it (and a client that allocates nothing),
// allocs/op is the proxy's.
func rawH2Backend(tb testing.TB) string {
	tb.Helper()
	// :status 200 (static index 8) and content-length: 13, added to
	// the dynamic table by the first response (literal with incremental
	// indexing, name static 28) and referred to (index 62) by every
	// later one, as HTTP/2 servers encode.
	first := []byte{0x88, 0x5c, 0x02, '1', '3'}
	later := []byte{0x88, 0xbe}
	return rawBackend(tb, func(c net.Conn) {
		block := first
		br := bufio.NewReaderSize(c, 32<<10)
		pre := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(br, pre); err != nil || string(pre) != http2.ClientPreface {
			return
		}
		var out []byte
		out = appendFrameHeader(out, 0, http2.FrameSettings, 0, 0)
		if _, err := c.Write(out); err != nil {
			return
		}
		var hdr [9]byte
		payload := make([]byte, 1<<20)
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
			typ, fl := http2.FrameType(hdr[3]), http2.Flags(hdr[4])
			sid := binary.BigEndian.Uint32(hdr[5:]) & (1<<31 - 1)
			if n > len(payload) {
				return
			}
			if _, err := io.ReadFull(br, payload[:n]); err != nil {
				return
			}
			out = out[:0]
			switch typ {
			case http2.FrameSettings:
				if fl&http2.FlagSettingsAck == 0 {
					out = appendFrameHeader(out, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
				}
			case http2.FramePing:
				if fl&http2.FlagPingAck == 0 {
					out = appendFrameHeader(out, 8, http2.FramePing, http2.FlagPingAck, 0)
					out = append(out, payload[:8]...)
				}
			case http2.FrameData:
				if n > 0 {
					out = appendFrameHeader(out, 4, http2.FrameWindowUpdate, 0, 0)
					out = binary.BigEndian.AppendUint32(out, uint32(n))
				}
			case http2.FrameGoAway:
				return
			}
			if (typ == http2.FrameHeaders || typ == http2.FrameData) && fl&http2.FlagDataEndStream != 0 {
				out = appendFrameHeader(out, len(block), http2.FrameHeaders, http2.FlagHeadersEndHeaders, sid)
				out = append(out, block...)
				block = later
				out = appendFrameHeader(out, 13, http2.FrameData, http2.FlagDataEndStream, sid)
				out = append(out, "hello, world\n"...)
			}
			if len(out) > 0 {
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		}
	})
}

// h2UpstreamConfig is a proxy to one HTTP/2 cleartext endpoint.
func h2UpstreamConfig(backend string) func(tb testing.TB) *Manager {
	return func(tb testing.TB) *Manager {
		cfg := proxyConfig(backend, h2cListener)
		cfg.Clusters[0].HTTP2 = true
		return startManager(tb, cfg, 1)
	}
}

// BenchmarkH2CToH2C: GETs on one HTTP/2 connection through the proxy to
// an HTTP/2 cleartext backend, client and backend allocating nothing:
// allocs/op is the proxy's (x/net's Transport took ~60).
func BenchmarkH2CToH2C(b *testing.B) {
	m := h2UpstreamConfig(rawH2Backend(b))(b)
	bc := newBenchH2Client(b, addr(b, m, "web"), "GET", "/", nil)
	bc.do(b) // the connection's first request builds what it keeps
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bc.do(b)
	}
}

// BenchmarkH2CToH2CPOST: the same with a 64-byte body, which the engine
// buffers whole and the client sends with the HEADERS.
func BenchmarkH2CToH2CPOST(b *testing.B) {
	m := h2UpstreamConfig(rawH2Backend(b))(b)
	body := make([]byte, 64)
	bc := newBenchH2Client(b, addr(b, m, "web"), "POST", "/", body)
	bc.do(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bc.do(b)
	}
}

// BenchmarkH1ToH2: HTTP/1.1 keep-alive GETs through the proxy to an
// HTTP/2 cleartext backend.
func BenchmarkH1ToH2(b *testing.B) {
	m := h2UpstreamConfig(rawH2Backend(b))(b)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	benchRaw(b, a, req, probeLen(b, a, req))
}

// TestH2UpstreamAllocs: a request proxied to an HTTP/2 upstream
// allocates (almost) nothing in the steady state now that the pool runs
// on h2's ClientConn: x/net's Transport and the net/http Request
// and Response it needed took ~60-90 per request. The bound leaves room
// for the goroutine that watches an HTTP/2 client's stream for a reset.
func TestH2UpstreamAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own account")
	}
	for _, c := range []struct {
		name  string
		bench func(*testing.B)
		max   int64
	}{
		{"h2c GET", BenchmarkH2CToH2C, 2},
		{"h2c POST", BenchmarkH2CToH2CPOST, 2},
		{"h1 GET", BenchmarkH1ToH2, 0},
	} {
		r := testing.Benchmark(c.bench)
		if r.N == 0 {
			t.Fatalf("%s: the benchmark failed", c.name)
		}
		if a := r.AllocsPerOp(); a > c.max {
			t.Errorf("%s: %d allocs/op (%d B/op) over %d requests, want at most %d", c.name, a, r.AllocedBytesPerOp(), r.N, c.max)
		}
		t.Logf("%s: %v %d allocs/op", c.name, r, r.AllocsPerOp())
	}
}
