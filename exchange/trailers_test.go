package exchange

import (
	"testing"

	"golang.org/x/net/http2/hpack"
)

// TestAppendHTTP1Trailers: framing, routing and hop-by-hop fields never
// pass as trailers; the rest keep their order and values, each name as
// appendName writes it.
func TestAppendHTTP1Trailers(t *testing.T) {
	fields := []hpack.HeaderField{
		{Name: "grpc-status", Value: "0"},
		{Name: "content-length", Value: "5"},
		{Name: "transfer-encoding", Value: "chunked"},
		{Name: "host", Value: "evil.example"},
		{Name: "x-checksum", Value: "abc"},
		{Name: "connection", Value: "close"},
		{Name: "te", Value: "trailers"},
		{Name: "trailer", Value: "x"},
		{Name: "upgrade", Value: "h2c"},
		{Name: "keep-alive", Value: "1"},
	}
	upper := func(b []byte, name string) []byte {
		for i := range len(name) {
			c := name[i]
			if c >= 'a' && c <= 'z' {
				c -= 'a' - 'A'
			}
			b = append(b, c)
		}
		return b
	}
	got := string(AppendHTTP1Trailers([]byte("x"), fields, upper))
	if want := "xGRPC-STATUS: 0\r\nX-CHECKSUM: abc\r\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
