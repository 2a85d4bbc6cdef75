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

// TestRequestTrailerRule: a client's trailer keeps its ordinary fields,
// in order and as spelt, and loses every field the head may not carry
// from it or the proxy sets, in any case and with '_' for '-', and those
// its Connection header named; it allocates nothing.
func TestRequestTrailerRule(t *testing.T) {
	var f ForwardedFields
	f.Reset(Client{IP: []byte("127.0.0.1")}, []byte("a.example"), false)
	f.NoteConnection([]byte("close, X-Hop ,keep-alive"))
	trailer := []byte("X-Checksum: abc\r\n" +
		"X-Forwarded-For: 10.0.0.1\r\nx_forwarded_for: 1\r\nX-FORWARDED-PROTO: https\r\nX-Forwarded-Host: e\r\n" +
		"Forwarded: for=1\r\nX-Real-IP: 1\r\nX-Request-Id: forged\r\nProxy-Authorization: x\r\nAuthorization: x\r\n" +
		"Max-Forwards: 0\r\nIf-Match: x\r\nIf-None-Match: x\r\nIf-Modified-Since: x\r\nIf-Unmodified-Since: x\r\nIf-Range: x\r\n" +
		"Range: x\r\nContent-Type: x\r\nContent-Encoding: x\r\nContent-Range: x\r\nCache-Control: x\r\nPragma: x\r\n" +
		"HTTP2-Settings: x\r\nx-hop: gone\r\nGrpc-Status: 0\r\n")
	got := string(f.AppendHTTP1RequestTrailer([]byte("0\r\n"), trailer))
	if want := "0\r\nX-Checksum: abc\r\nGrpc-Status: 0\r\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	buf := make([]byte, 0, 4096)
	client, connection := Client{IP: []byte("127.0.0.1")}, []byte("X-Hop")
	if n := testing.AllocsPerRun(100, func() {
		f.Reset(client, nil, false)
		f.NoteConnection(connection)
		buf = f.AppendHTTP1RequestTrailer(buf[:0], trailer)
	}); n != 0 {
		t.Errorf("%v allocations per trailer, want 0", n)
	}
	for _, name := range []string{"host", "content-length", "transfer-encoding", "te", "trailer", "connection", "keep-alive", "upgrade", "proxy-connection", "expect", "x-forwarded-for", "x-request-id"} {
		if RequestTrailerMayCarry(name) {
			t.Errorf("%s passes as a request trailer", name)
		}
	}
	fields := []hpack.HeaderField{{Name: "host", Value: "x"}, {Name: "x-checksum", Value: "abc"}, {Name: "x-forwarded-for", Value: "1"}, {Name: "grpc-timeout", Value: "1S"}}
	kept := KeepRequestTrailers(fields)
	if len(kept) != 2 || kept[0].Name != "x-checksum" || kept[1].Name != "grpc-timeout" {
		t.Fatalf("kept %v", kept)
	}
}

// TestConnectionNamedOverflow: a Connection header naming more than the
// proxy remembers drops the whole trailer rather than let one through.
func TestConnectionNamedOverflow(t *testing.T) {
	var f ForwardedFields
	f.Reset(Client{}, nil, false)
	for range 20 {
		f.NoteConnection([]byte("X-Some-Long-Field-Name"))
	}
	if got := string(f.AppendHTTP1RequestTrailer(nil, []byte("X-Checksum: abc\r\n"))); got != "" {
		t.Fatalf("got %q, want nothing", got)
	}
}
