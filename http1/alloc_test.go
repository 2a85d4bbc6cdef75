package http1

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

// browserGET is a typical browser-like request of about 400 bytes.
var browserGET = head(
	"GET /static/app.js?v=123 HTTP/1.1",
	"Host: www.example.com",
	"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
	"Accept: */*",
	"Accept-Language: en-US,en;q=0.5",
	"Accept-Encoding: gzip, deflate, br",
	"Referer: https://www.example.com/",
	"Connection: keep-alive",
	"Cookie: session=abcdef0123456789; theme=dark",
	"Sec-Fetch-Dest: script",
	"Sec-Fetch-Mode: no-cors",
)

var typicalResponse = head(
	"HTTP/1.1 200 OK",
	"Date: Mon, 30 Nov 2026 22:00:00 GMT",
	"Content-Type: application/javascript",
	"Content-Length: 5120",
	"Cache-Control: public, max-age=3600",
	"ETag: \"5f3a-abc\"",
	"Connection: keep-alive",
)

func chunkedBody() []byte {
	var b []byte
	for i := 0; i < 8; i++ {
		b = AppendChunkHeader(b, 512)
		b = append(b, strings.Repeat("x", 512)...)
		b = append(b, "\r\n"...)
	}
	return AppendLastChunk(b, []byte("X-Sum: 1\r\n"))
}

func decodeAll(d *ChunkedDecoder, body []byte) int {
	d.Reset()
	total := 0
	for len(body) > 0 {
		n, data, _, done, err := d.Next(body)
		if err != nil || n == 0 {
			return -1
		}
		total += len(data)
		body = body[n:]
		if done {
			break
		}
	}
	return total
}

// TestNoAllocations proves the per-request paths allocate nothing, on
// success and on error.
func TestNoAllocations(t *testing.T) {
	if len(browserGET) < 380 || len(browserGET) > 420 {
		t.Fatalf("browserGET is %d bytes; keep it near 400 so the benchmark means what it says", len(browserGET))
	}
	var r Request
	var resp Response
	var d ChunkedDecoder
	get, bad, partial := []byte(browserGET), []byte(head("GET / HTTP/1.1", "Host: a", "Content-Length: 1", "Transfer-Encoding: chunked")), []byte(browserGET[:200])
	respBuf, body := []byte(typicalResponse), chunkedBody()
	badBody := []byte("5;a=b\r\nhelloX")
	dst := make([]byte, 0, 256)
	target := []byte("/a/./b/../%41dmin;x//c?q")
	checks := []struct {
		name string
		fn   func()
	}{
		{"Request.Parse", func() {
			if r.Parse(get, Limits{}) != nil {
				t.Fatal("typical request rejected")
			}
		}},
		{"Request.Parse rejecting", func() {
			if r.Parse(bad, Limits{}) == nil {
				t.Fatal("CL+TE accepted")
			}
		}},
		{"Request.Parse incomplete", func() {
			if r.Parse(partial, Limits{}) != ErrIncomplete {
				t.Fatal("partial head not ErrIncomplete")
			}
		}},
		{"Response.Parse", func() {
			if resp.Parse(respBuf, Limits{}, []byte("GET")) != nil {
				t.Fatal("typical response rejected")
			}
		}},
		{"ChunkedDecoder.Next", func() {
			if decodeAll(&d, body) != 8*512 {
				t.Fatal("chunked body misread")
			}
		}},
		{"ChunkedDecoder.Next rejecting", func() {
			if decodeAll(&d, badBody) != -1 {
				t.Fatal("bad chunked body accepted")
			}
		}},
		{"CleanPath", func() { dst = CleanPath(dst[:0], target) }},
		{"CheckRequestParts", func() {
			if CheckRequestParts([]byte("GET"), target, []byte("a.example:80"), Limits{}) != nil {
				t.Fatal("valid parts refused")
			}
		}},
		{"CheckRequestParts rejecting", func() {
			if CheckRequestParts([]byte("GET"), dst, []byte("a..b"), Limits{}) == nil {
				t.Fatal("empty label accepted")
			}
		}},
		{"EqualFold", func() { _ = EqualFold(get[:3], "get") }},
	}
	for _, c := range checks {
		if allocs := testing.AllocsPerRun(100, c.fn); allocs != 0 {
			t.Errorf("%s: %.1f allocations per call, want 0", c.name, allocs)
		}
	}
}

func BenchmarkParseRequest(b *testing.B) {
	buf := []byte(browserGET)
	var r Request
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := r.Parse(buf, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseResponse(b *testing.B) {
	buf := []byte(typicalResponse)
	var r Response
	method := []byte("GET")
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := r.Parse(buf, Limits{}, method); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkChunkedDecode(b *testing.B) {
	body := chunkedBody()
	var d ChunkedDecoder
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if decodeAll(&d, body) != 8*512 {
			b.Fatal("chunked body misread")
		}
	}
}

func BenchmarkCleanPath(b *testing.B) {
	target := []byte("/static/./js/../app.js;v=1?x=y")
	dst := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = CleanPath(dst[:0], target)
	}
}

// BenchmarkNetHTTPReadRequest is the yardstick: net/http parsing the same
// request as BenchmarkParseRequest.
func BenchmarkNetHTTPReadRequest(b *testing.B) {
	b.ReportAllocs()
	sr := strings.NewReader(browserGET)
	br := bufio.NewReader(sr)
	for b.Loop() {
		sr.Reset(browserGET)
		br.Reset(sr)
		if _, err := http.ReadRequest(br); err != nil {
			b.Fatal(err)
		}
	}
}
