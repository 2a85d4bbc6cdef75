package workers

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// benchH2Client is an HTTP/2 client that allocates nothing per request:
// a HEADERS (and DATA) frame encoded once, replayed on stream after
// stream, and the response's frames read by hand. With it, allocs/op is
// the proxy's own.
type benchH2Client struct {
	c       net.Conn
	id      uint32
	first   []byte // the first HEADERS frame's payload
	headers []byte // every later one's
	body    []byte
	out     []byte
	in      [16 << 10]byte
	hdr     [9]byte
}

func newBenchH2Client(b *testing.B, addr, method, path string, body []byte) *benchH2Client {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	// Encoded twice with the dynamic table, as browsers and h2load
	// encode: the first block adds :authority and user-agent to the
	// table, the second only refers to entries, so it can be replayed
	// on every later stream and leaves the table as it is.
	var blk bytes.Buffer
	enc := hpack.NewEncoder(&blk)
	encode := func() []byte {
		blk.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: method}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: addr}, {Name: ":path", Value: path},
			{Name: "user-agent", Value: "bench"},
		} {
			enc.WriteField(f)
		}
		return bytes.Clone(blk.Bytes())
	}
	bc := &benchH2Client{c: c, id: 1, body: body}
	bc.first, bc.headers = encode(), encode()
	var pre bytes.Buffer
	pre.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&pre, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30)
	if _, err := c.Write(pre.Bytes()); err != nil {
		b.Fatal(err)
	}
	return bc
}

func appendFrameHeader(b []byte, length int, typ http2.FrameType, flags http2.Flags, id uint32) []byte {
	b = append(b, byte(length>>16), byte(length>>8), byte(length), byte(typ), byte(flags))
	return binary.BigEndian.AppendUint32(b, id)
}

// do sends one request and reads until its stream ends; the status is
// checked to be 200 (":status: 200" is HPACK's static index 8: 0x88).
func (bc *benchH2Client) do(b *testing.B) {
	id := bc.id
	bc.id += 2
	flags := http2.FlagHeadersEndHeaders
	if len(bc.body) == 0 {
		flags |= http2.FlagHeadersEndStream
	}
	block := bc.headers
	if id == 1 {
		block = bc.first
	}
	bc.out = appendFrameHeader(bc.out[:0], len(block), http2.FrameHeaders, flags, id)
	bc.out = append(bc.out, block...)
	if len(bc.body) > 0 {
		bc.out = appendFrameHeader(bc.out, len(bc.body), http2.FrameData, http2.FlagDataEndStream, id)
		bc.out = append(bc.out, bc.body...)
	}
	if _, err := bc.c.Write(bc.out); err != nil {
		b.Fatal(err)
	}
	status := false
	for {
		if _, err := io.ReadFull(bc.c, bc.hdr[:]); err != nil {
			b.Fatal(err)
		}
		n := int(bc.hdr[0])<<16 | int(bc.hdr[1])<<8 | int(bc.hdr[2])
		typ, fl := http2.FrameType(bc.hdr[3]), http2.Flags(bc.hdr[4])
		sid := binary.BigEndian.Uint32(bc.hdr[5:]) & (1<<31 - 1)
		if n > len(bc.in) {
			b.Fatalf("frame of %d bytes", n)
		}
		if _, err := io.ReadFull(bc.c, bc.in[:n]); err != nil {
			b.Fatal(err)
		}
		switch typ {
		case http2.FrameSettings:
			if fl&http2.FlagSettingsAck == 0 {
				bc.out = appendFrameHeader(bc.out[:0], 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
				bc.c.Write(bc.out)
			}
		case http2.FrameGoAway, http2.FrameRSTStream:
			b.Fatalf("%v on stream %d", typ, sid)
		case http2.FrameHeaders:
			if sid == id && n > 0 && !status {
				if bc.in[0] != 0x88 && !(bc.in[0] == 0x20 && n > 1 && bc.in[1] == 0x88) {
					b.Fatalf("response head %x, want :status 200", bc.in[:min(n, 8)])
				}
				status = true
			}
		}
		if sid == id && (typ == http2.FrameHeaders || typ == http2.FrameData) && fl&http2.FlagDataEndStream != 0 {
			if !status {
				b.Fatal("stream ended without a 200")
			}
			return
		}
	}
}

// BenchmarkH2CProxyRawClient: GETs on one HTTP/2 connection through the
// proxy to an HTTP/1.1 keep-alive backend, from a client that allocates
// nothing: allocs/op is the proxy's.
func BenchmarkH2CProxyRawClient(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, h2cListener), 1)
	bc := newBenchH2Client(b, addr(b, m, "web"), "GET", "/", nil)
	bc.do(b) // the connection's first request builds what it keeps
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bc.do(b)
	}
}

// BenchmarkH2CProxyRawClientPOST: the same with a 64-byte request body,
// which the engine buffers whole (so it is sent with the head).
func BenchmarkH2CProxyRawClientPOST(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, proxyConfig(be, h2cListener), 1)
	bc := newBenchH2Client(b, addr(b, m, "web"), "POST", "/", bytes.Repeat([]byte("p"), 64))
	bc.do(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bc.do(b)
	}
}

// TestH2CProxyZeroAllocs: an HTTP/2 request with a buffered body proxied
// to an HTTP/1.1 upstream allocates nothing in the steady state, as an
// HTTP/1.1 one does (issue 21). x/net's server took ~45 per request.
func TestH2CProxyZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own account")
	}
	for name, bench := range map[string]func(*testing.B){
		"GET": BenchmarkH2CProxyRawClient, "POST": BenchmarkH2CProxyRawClientPOST,
	} {
		r := testing.Benchmark(bench)
		if r.N == 0 {
			t.Fatalf("%s: the benchmark failed", name)
		}
		if a := r.AllocsPerOp(); a != 0 {
			t.Errorf("%s: %d allocs/op (%d B/op) over %d requests, want 0", name, a, r.AllocedBytesPerOp(), r.N)
		}
		t.Logf("%s: %v", name, r)
	}
}
