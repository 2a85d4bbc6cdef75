package http1

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// decodeChunked feeds body to a fresh decoder in pieces whose sizes come
// from split (nil: all at once), keeping unconsumed bytes at the front the
// way a connection's read buffer does. It returns the payload and trailer,
// or the decoder's error; errIncompleteBody when the body never ends.
func decodeChunked(tb testing.TB, body []byte, split func() int) (payload, trailer []byte, err error) {
	tb.Helper()
	var d ChunkedDecoder
	var buf []byte // what has been read and not consumed
	fed := 0
	for steps := 0; steps < 10*len(body)+10; steps++ {
		n, data, tr, done, err := d.Next(buf)
		if err != nil {
			return payload, nil, err
		}
		payload = append(payload, data...)
		if done {
			return payload, append([]byte{}, tr...), nil
		}
		buf = buf[n:]
		if n == 0 {
			if fed == len(body) {
				return payload, nil, errIncompleteBody
			}
			k := len(body) - fed
			if split != nil {
				k = min(k, split())
			}
			buf = append(append([]byte{}, buf...), body[fed:fed+k]...)
			fed += k
		}
	}
	tb.Fatalf("decoder made no progress on %q", body)
	return nil, nil, nil
}

var errIncompleteBody = errors.New("body incomplete")

func TestChunkedRejections(t *testing.T) {
	cases := []struct{ name, body string }{
		{"size 5g", "5g\r\nhello\r\n0\r\n\r\n"},
		{"size -5", "-5\r\nhello\r\n0\r\n\r\n"},
		{"size 0x5", "0x5\r\nhello\r\n0\r\n\r\n"},
		{"size +5", "+5\r\nhello\r\n0\r\n\r\n"},
		{"leading space", " 5\r\nhello\r\n0\r\n\r\n"},
		{"leading tab", "\t5\r\nhello\r\n0\r\n\r\n"},
		{"trailing space", "5 \r\nhello\r\n0\r\n\r\n"},
		{"space before extension", "5 ;a\r\nhello\r\n0\r\n\r\n"},
		{"empty size", "\r\nhello\r\n0\r\n\r\n"},
		{"16 hex digits", "0000000000000005\r\nhello\r\n0\r\n\r\n"},
		{"overflow", "ffffffffffffffffff\r\nhello\r\n0\r\n\r\n"},
		{"data not followed by CRLF", "5\r\nhelloX\r\n0\r\n\r\n"},
		{"data followed by LF", "5\r\nhello\n0\r\n\r\n"},
		{"data followed by CR only", "5\r\nhello\r0\r\n\r\n"},
		{"data longer than size", "3\r\nhello\r\n0\r\n\r\n"},
		{"bare LF after size", "5\nhello\r\n0\r\n\r\n"},
		{"bare CR in size line", "5\r;a\r\nhello\r\n0\r\n\r\n"},
		{"bare LF after last chunk", "0\n\r\n"},
		{"bare LF ending the body", "0\r\n\n"},
		{"extension without name", "5;\r\nhello\r\n0\r\n\r\n"},
		{"extension name not a token", "5;a(b)\r\nhello\r\n0\r\n\r\n"},
		{"extension with empty value", "5;a=\r\nhello\r\n0\r\n\r\n"},
		{"extension with unterminated quote", "5;a=\"b\r\nhello\r\n0\r\n\r\n"},
		{"extension with control character", "5;a=\"\x01\"\r\nhello\r\n0\r\n\r\n"},
		{"extension with trailing space", "5;a=b \r\nhello\r\n0\r\n\r\n"},
		{"size line too long", "5;a=" + strings.Repeat("b", maxChunkLine) + "\r\nhello\r\n0\r\n\r\n"},
		{"size line too long, incomplete", "5;a=" + strings.Repeat("b", maxChunkLine)},
		{"trailer obs-fold", "0\r\nX: a\r\n b\r\n\r\n"},
		{"trailer space before colon", "0\r\nX : a\r\n\r\n"},
		{"trailer bare CR", "0\r\nX: a\rb\r\n\r\n"},
		{"trailer NUL", "0\r\nX: \x00\r\n\r\n"},
		{"trailer Content-Length", "0\r\nContent-Length: 5\r\n\r\n"},
		{"trailer Transfer-Encoding", "0\r\ntransfer-encoding: chunked\r\n\r\n"},
		{"trailer Host", "0\r\nX: y\r\nHost: evil\r\n\r\n"},
		{"trailer Connection", "0\r\nConnection: close\r\n\r\n"},
		{"trailer too large", "0\r\nX: " + strings.Repeat("a", maxTrailer) + "\r\n\r\n"},
		{"too much non-data", strings.Repeat("1;"+strings.Repeat("x", 100)+"\r\na\r\n", 200) + "0\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, split := range []func() int{nil, func() int { return 1 }} {
				_, _, err := decodeChunked(t, []byte(tc.body), split)
				var e *Error
				if !errors.As(err, &e) || e.Status != 400 {
					t.Fatalf("decoding %q: %v, want an *Error with status 400", tc.body, err)
				}
			}
		})
	}
}

func TestChunkedAccepted(t *testing.T) {
	cases := []struct{ name, body, payload, trailer string }{
		{"simple", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", ""},
		{"uppercase hex and leading zeros", "00A\r\n0123456789\r\n000\r\n\r\n", "0123456789", ""},
		{"15 hex digits", "00000000000000A\r\n0123456789\r\n0\r\n\r\n", "0123456789", ""},
		{"extensions", "5;a;b=c; d = \"e;\\\"f\"\r\nhello\r\n0;last\r\n\r\n", "hello", ""},
		{"trailer", "3\r\nabc\r\n0\r\nX-Sum: 1\r\nX-Other:  two \r\n\r\n", "abc", "X-Sum: 1\r\nX-Other:  two \r\n"},
		{"empty body", "0\r\n\r\n", "", ""},
		{"data holding CRLF", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			payload, trailer, err := decodeChunked(t, []byte(tc.body), nil)
			if err != nil || string(payload) != tc.payload || string(trailer) != tc.trailer {
				t.Fatalf("decode(%q) = %q, %q, %v; want %q, %q", tc.body, payload, trailer, err, tc.payload, tc.trailer)
			}
		})
	}
}

// TestChunkedRandomSplits decodes bodies fed in random pieces: the payload
// and trailer must be those of decoding it all at once.
func TestChunkedRandomSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 300; iter++ {
		var body, want []byte
		for c := rng.IntN(6); c >= 0; c-- {
			data := make([]byte, rng.IntN(300)+1)
			for i := range data {
				data[i] = byte(rng.IntN(256))
			}
			want = append(want, data...)
			body = AppendChunkHeader(body, len(data))
			if rng.IntN(3) == 0 {
				body = append(body[:len(body)-2], ";ext=\"v\"\r\n"...)
			}
			body = append(append(body, data...), "\r\n"...)
		}
		trailer := ""
		if rng.IntN(2) == 0 {
			trailer = "X-Checksum: abc\r\nX-B: c\r\n"
		}
		body = AppendLastChunk(body, []byte(trailer))
		whole, wholeTrailer, err := decodeChunked(t, body, nil)
		if err != nil || !bytes.Equal(whole, want) || string(wholeTrailer) != trailer {
			t.Fatalf("all at once: %v, payload equal %v, trailer %q", err, bytes.Equal(whole, want), wholeTrailer)
		}
		maxPiece := rng.IntN(20) + 1
		split, splitTrailer, err := decodeChunked(t, body, func() int { return rng.IntN(maxPiece) + 1 })
		if err != nil || !bytes.Equal(split, whole) || !bytes.Equal(splitTrailer, wholeTrailer) {
			t.Fatalf("in pieces of up to %d: %v, payload equal %v, trailer %q", maxPiece, err, bytes.Equal(split, whole), splitTrailer)
		}
	}
}

func TestChunkedAfterDoneAndReset(t *testing.T) {
	var d ChunkedDecoder
	body := []byte("1\r\na\r\n0\r\n\r\n1\r\nb\r\n0\r\n\r\n")
	consumed := 0
	for {
		n, _, _, done, err := d.Next(body[consumed:])
		if err != nil {
			t.Fatal(err)
		}
		consumed += n
		if done {
			break
		}
	}
	if consumed != 11 {
		t.Fatalf("first body took %d bytes, want 11: the decoder must stop at the end of the body", consumed)
	}
	if _, _, _, _, err := d.Next(body[consumed:]); err == nil {
		t.Fatal("Next after the end of the body succeeded; it must say the body is over")
	}
	d.Reset()
	n, data, _, _, err := d.Next(body[consumed:])
	if err != nil || string(data) != "b" || n != 6 {
		t.Fatalf("after Reset: n %d data %q err %v", n, data, err)
	}
}

func TestAppendChunk(t *testing.T) {
	for _, tc := range []struct {
		size int
		want string
	}{{0, "0\r\n"}, {1, "1\r\n"}, {255, "ff\r\n"}, {4096, "1000\r\n"}, {1<<62 + 1, "4000000000000001\r\n"}} {
		if got := string(AppendChunkHeader([]byte("x"), tc.size)); got != "x"+tc.want {
			t.Errorf("AppendChunkHeader(%d) = %q", tc.size, got)
		}
	}
	if got := string(AppendLastChunk(nil, nil)); got != "0\r\n\r\n" {
		t.Errorf("AppendLastChunk without trailer = %q", got)
	}
	if got := string(AppendLastChunk([]byte("a"), []byte("X: y\r\n"))); got != "a0\r\nX: y\r\n\r\n" {
		t.Errorf("AppendLastChunk with trailer = %q", got)
	}
}

// TestNextTrailerField walks a decoded trailer section field by field.
func TestNextTrailerField(t *testing.T) {
	trailer := []byte("X-A: 1\r\nX-B:\t two \r\n")
	var got []string
	for pos := 0; ; {
		name, value, next, ok := NextTrailerField(trailer, pos)
		if !ok {
			break
		}
		got = append(got, string(name)+"="+string(value))
		pos = next
	}
	if strings.Join(got, ",") != "X-A=1,X-B=two" {
		t.Fatalf("got %q", got)
	}
	if _, _, _, ok := NextTrailerField([]byte("bad line\r\n"), 0); ok {
		t.Fatal("a line without a colon is a field")
	}
}
