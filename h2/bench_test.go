package h2

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

var (
	benchFields = []hpack.HeaderField{{Name: "content-type", Value: "text/plain"}, {Name: "server", Value: "hotproxy"}}
	benchBody   = []byte("hello, h2\n")
)

// benchHandler answers 200 with a small body, allocating nothing.
var benchHandler = HandlerFunc(func(st *Stream) {
	if _, complete := st.Body(); !complete {
		st.Reset(http2.ErrCodeInternal)
		return
	}
	st.WriteHeaders(200, benchFields, false)
	st.Write(benchBody)
})

// benchPostHandler answers a buffered POST, watching Done as a proxy
// handler does while it waits for its upstream.
var benchPostHandler = HandlerFunc(func(st *Stream) {
	body, complete := st.Body()
	if !complete || len(body) != len(benchBody) {
		st.Reset(http2.ErrCodeInternal)
		return
	}
	select {
	case <-st.Done():
		return
	default:
	}
	st.WriteHeaders(200, benchFields, false)
	st.Write(body)
})

// BenchmarkServerPOST: as BenchmarkServerGET with a 10-byte request body
// in one DATA frame (content-length given), buffered before the handler.
func BenchmarkServerPOST(b *testing.B) {
	ts := startServer(b, &ServerConfig{}, benchPostHandler, nil)
	runBenchClientBody(b, ts.addr(), 32, benchBody)
}

// BenchmarkServerGET: GETs (body complete, so handed over buffered)
// answered 200 with a 10-byte body over one loopback connection, 32
// streams in flight; the client side is written not to allocate, so
// allocs/op is the server's.
func BenchmarkServerGET(b *testing.B) {
	ts := startServer(b, &ServerConfig{}, benchHandler, nil)
	runBenchClient(b, ts.addr(), 32)
}

// runBenchClient drives b.N requests with up to inflight streams open.
func runBenchClient(b *testing.B, addr string, inflight int) {
	runBenchClientBody(b, addr, inflight, nil)
}

// runBenchClientBody: with body non-nil, each request is a POST carrying
// it in one DATA frame.
func runBenchClientBody(b *testing.B, addr string, inflight int, body []byte) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	bw := bufio.NewWriterSize(c, 32<<10)
	fr := http2.NewFramer(bw, nil)
	bw.WriteString(http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow})
	fr.WriteWindowUpdate(0, maxWindow-65535)
	bw.Flush()

	var encBuf bytes.Buffer
	enc := hpack.NewEncoder(&encBuf)
	encode := func() []byte {
		encBuf.Reset()
		method := "GET"
		if body != nil {
			method = "POST"
		}
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: method}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: "bench.example"}, {Name: ":path", Value: "/bench/path"}, {Name: "user-agent", Value: "h2bench"}} {
			enc.WriteField(f)
		}
		if body != nil {
			enc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
		}
		return append([]byte(nil), encBuf.Bytes()...)
	}
	first, again := encode(), encode() // again: all indexed in the dynamic table
	frame := make([]byte, 9+len(again)+9+len(body))

	tokens := make(chan struct{}, inflight)
	for i := 0; i < inflight; i++ {
		tokens <- struct{}{}
	}
	readDone := make(chan error, 1)
	total := b.N
	go func() {
		br := bufio.NewReaderSize(c, 64<<10)
		var hdr [9]byte
		payload := make([]byte, 1<<16)
		done := 0
		for done < total {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				readDone <- err
				return
			}
			n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
			if _, err := io.ReadFull(br, payload[:n]); err != nil {
				readDone <- err
				return
			}
			typ, flags := http2.FrameType(hdr[3]), http2.Flags(hdr[4])
			if (typ == http2.FrameData || typ == http2.FrameHeaders) && flags.Has(http2.FlagDataEndStream) {
				done++
				tokens <- struct{}{}
			}
			if typ == http2.FrameRSTStream || typ == http2.FrameGoAway {
				readDone <- io.ErrUnexpectedEOF
				return
			}
		}
		readDone <- nil
	}()

	b.ReportAllocs()
	b.ResetTimer()
	id := uint32(1)
	for i := 0; i < total; i++ {
		select {
		case <-tokens:
		default:
			bw.Flush()
			<-tokens
		}
		block := again
		if i == 0 {
			block = first
		}
		frame = frame[:9]
		frame[0], frame[1], frame[2] = byte(len(block)>>16), byte(len(block)>>8), byte(len(block))
		frame[3] = byte(http2.FrameHeaders)
		frame[4] = byte(http2.FlagHeadersEndHeaders | http2.FlagHeadersEndStream)
		binary.BigEndian.PutUint32(frame[5:], id)
		frame = append(frame, block...)
		if body != nil {
			frame[4] = byte(http2.FlagHeadersEndHeaders)
			frame = append(frame, byte(len(body)>>16), byte(len(body)>>8), byte(len(body)), byte(http2.FrameData), byte(http2.FlagDataEndStream))
			frame = binary.BigEndian.AppendUint32(frame, id)
			frame = append(frame, body...)
		}
		bw.Write(frame)
		id += 2
	}
	bw.Flush()
	if err := <-readDone; err != nil {
		b.Fatalf("reading responses: %v", err)
	}
}

// benchLastHandler is benchHandler ending the response in the DATA frame
// that carries its body (Stream.WriteLast), as a proxy does for a body of
// known length.
var benchLastHandler = HandlerFunc(func(st *Stream) {
	if _, complete := st.Body(); !complete {
		st.Reset(http2.ErrCodeInternal)
		return
	}
	st.WriteHeaders(200, benchFields, false)
	st.WriteLast(benchBody)
})

// BenchmarkServerGETWriteLast: BenchmarkServerGET answered with WriteLast
// (one DATA frame per response instead of a DATA and an empty one).
func BenchmarkServerGETWriteLast(b *testing.B) {
	ts := startServer(b, &ServerConfig{}, benchLastHandler, nil)
	runBenchClient(b, ts.addr(), 32)
}
