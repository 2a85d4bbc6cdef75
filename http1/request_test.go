package http1

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// statusOf is the status an error answers with: 0 for success, -1 for
// ErrIncomplete.
func statusOf(tb testing.TB, err error) int {
	tb.Helper()
	if err == nil {
		return 0
	}
	if errors.Is(err, ErrIncomplete) {
		return -1
	}
	var e *Error
	if !errors.As(err, &e) {
		tb.Fatalf("error %v (%T) is neither ErrIncomplete nor *Error", err, err)
	}
	return e.Status
}

// head joins lines with CRLF and ends the head with an empty line.
func head(lines ...string) string { return strings.Join(lines, "\r\n") + "\r\n\r\n" }

type requestCase struct {
	name   string
	in     string
	status int // 0: accepted
}

// requestRejections are the smuggling and malformed-head cases: each names
// the rule it breaks and the status a server must answer.
var requestRejections = []requestCase{
	// framing: Content-Length and Transfer-Encoding
	{"CL and TE", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5", "Transfer-Encoding: chunked"), 400},
	{"TE and CL", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Content-Length: 5"), 400},
	{"TE chunked in HTTP/1.0", head("POST / HTTP/1.0", "Transfer-Encoding: chunked"), 400},
	{"TE chunked, identity", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked, identity"), 400},
	{"TE identity, chunked", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: identity, chunked"), 400},
	{"TE xchunked", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: xchunked"), 400},
	{"TE chunked with junk", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked;q=1"), 400},
	{"TE gzip", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: gzip"), 400},
	{"TE twice", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400},
	{"TE space before colon", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding : chunked"), 400},
	{"TE tab before colon", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding\t: chunked"), 400},
	{"TE vertical tab in value", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: \vchunked"), 400},
	{"TE empty", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: "), 400},
	{"CL differing duplicates", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5", "Content-Length: 6"), 400},
	{"CL differing list", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5, 6"), 400},
	{"CL same value spelt differently", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5", "Content-Length: 05"), 400},
	{"CL plus sign", head("POST / HTTP/1.1", "Host: a", "Content-Length: +5"), 400},
	{"CL minus sign", head("POST / HTTP/1.1", "Host: a", "Content-Length: -5"), 400},
	{"CL underscore", head("POST / HTTP/1.1", "Host: a", "Content-Length: 1_0"), 400},
	{"CL hex", head("POST / HTTP/1.1", "Host: a", "Content-Length: 0x5"), 400},
	{"CL space inside", head("POST / HTTP/1.1", "Host: a", "Content-Length: 1 0"), 400},
	{"CL empty", head("POST / HTTP/1.1", "Host: a", "Content-Length: "), 400},
	{"CL only commas", head("POST / HTTP/1.1", "Host: a", "Content-Length: ,"), 400},
	{"CL empty next to a value", head("POST / HTTP/1.0", "Content-Length: 0", "Content-Length:"), 400},
	{"CL trailing comma", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5,"), 400},
	{"CL empty element", head("POST / HTTP/1.1", "Host: a", "Content-Length: 5, ,5"), 400},
	{"CL overflow", head("POST / HTTP/1.1", "Host: a", "Content-Length: 9223372036854775808"), 400},
	{"CL far overflow", head("POST / HTTP/1.1", "Host: a", "Content-Length: 99999999999999999999999"), 400},
	// line endings and folding
	{"obs-fold", head("GET / HTTP/1.1", "Host: a", "X-A: b", " c"), 400},
	{"obs-fold with tab", head("GET / HTTP/1.1", "Host: a", "X-A: b", "\tc"), 400},
	{"obs-fold of TE", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding:", " chunked"), 400},
	{"first field folded", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400},
	{"bare LF ending a field", "GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", 400},
	{"bare LF ending the request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", 400},
	{"bare LF ending the head", "GET / HTTP/1.1\r\nHost: a\r\n\n", 400},
	{"only bare LFs", "GET / HTTP/1.1\nHost: a\n\n", 400},
	{"bare CR in value", head("GET / HTTP/1.1", "Host: a", "X: a\rb"), 400},
	{"bare CR in name", head("GET / HTTP/1.1", "Host: a", "X\r: a"), 400},
	{"bare CR ending a field", "GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400},
	{"bare CR in request line", "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n", 400},
	{"CR CR LF", "GET / HTTP/1.1\r\r\nHost: a\r\n\r\n", 400},
	{"empty line before request line", "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
	{"bare LF before request line", "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
	// field lines
	{"NUL in value", head("GET / HTTP/1.1", "Host: a", "X: a\x00b"), 400},
	{"DEL in value", head("GET / HTTP/1.1", "Host: a", "X: a\x7fb"), 400},
	{"escape in value", head("GET / HTTP/1.1", "Host: a", "X: a\x1bb"), 400},
	{"space before colon", head("GET / HTTP/1.1", "Host: a", "X-A : b"), 400},
	{"space in name", head("GET / HTTP/1.1", "Host: a", "X A: b"), 400},
	{"empty name", head("GET / HTTP/1.1", "Host: a", ": b"), 400},
	{"no colon", head("GET / HTTP/1.1", "Host: a", "X-A b"), 400},
	{"non-token in name", head("GET / HTTP/1.1", "Host: a", "X(A): b"), 400},
	{"obs-text in name", head("GET / HTTP/1.1", "Host: a", "X\xe9: b"), 400},
	// Host
	{"two Host fields", head("GET / HTTP/1.1", "Host: a", "Host: b"), 400},
	{"two identical Host fields", head("GET / HTTP/1.1", "Host: a", "Host: a"), 400},
	{"two Host fields in HTTP/1.0", head("GET / HTTP/1.0", "Host: a", "Host: b"), 400},
	{"missing Host in HTTP/1.1", head("GET / HTTP/1.1", "X: y"), 400},
	{"empty Host", head("GET / HTTP/1.1", "Host: "), 400},
	{"Host with userinfo", head("GET / HTTP/1.1", "Host: u@a"), 400},
	{"Host with path", head("GET / HTTP/1.1", "Host: a/b"), 400},
	{"Host with empty port", head("GET / HTTP/1.1", "Host: a:"), 400},
	{"Host with bad port", head("GET / HTTP/1.1", "Host: a:8x"), 400},
	{"Host with two colons", head("GET / HTTP/1.1", "Host: a:1:2"), 400},
	{"Host with space", head("GET / HTTP/1.1", "Host: a b"), 400},
	{"Host bad IPv6", head("GET / HTTP/1.1", "Host: [::g]"), 400},
	{"Host IPv4 in brackets", head("GET / HTTP/1.1", "Host: [1.2.3.4]"), 400},
	{"Host unclosed bracket", head("GET / HTTP/1.1", "Host: [::1"), 400},
	{"Host with an empty label", head("GET / HTTP/1.1", "Host: secret.test..b"), 400},
	{"Host with two trailing dots", head("GET / HTTP/1.1", "Host: secret.test.."), 400},
	{"Host with a leading dot", head("GET / HTTP/1.1", "Host: .secret.test"), 400},
	{"Host only a dot", head("GET / HTTP/1.1", "Host: ."), 400},
	{"Host with two trailing dots and a port", head("GET / HTTP/1.1", "Host: a..:80"), 400},
	{"Host with a semicolon", head("GET / HTTP/1.1", "Host: secret.test;x"), 400},
	{"Host a list", head("GET / HTTP/1.1", "Host: a,b"), 400},
	{"absolute-form with an empty label", head("GET http://a..b/ HTTP/1.1", "Host: a..b"), 400},
	{"CONNECT with an empty label", head("CONNECT a..b:443 HTTP/1.1", "Host: a..b:443"), 400},
	{"Host disagreeing with absolute-form", head("GET http://a/ HTTP/1.1", "Host: b"), 400},
	{"Host port disagreeing with absolute-form", head("GET http://a:80/ HTTP/1.1", "Host: a"), 400},
	// request line
	{"two spaces after method", head("GET  / HTTP/1.1", "Host: a"), 400},
	{"two spaces before version", head("GET /  HTTP/1.1", "Host: a"), 400},
	{"tab separator", head("GET\t/ HTTP/1.1", "Host: a"), 400},
	{"trailing space", head("GET / HTTP/1.1 ", "Host: a"), 400},
	{"no version", head("GET /", "Host: a"), 400},
	{"lowercase version", head("GET / http/1.1", "Host: a"), 400},
	{"HTTP/1.2", head("GET / HTTP/1.2", "Host: a"), 400},
	{"HTTP/1.10", head("GET / HTTP/1.10", "Host: a"), 400},
	{"HTTP/2.0", head("GET / HTTP/2.0", "Host: a"), 505},
	{"HTTP/0.9", head("GET / HTTP/0.9", "Host: a"), 505},
	{"HTTP/3.0", head("GET / HTTP/3.0", "Host: a"), 505},
	{"non-token method", head("G(T / HTTP/1.1", "Host: a"), 400},
	{"empty method", head(" / HTTP/1.1", "Host: a"), 400},
	{"NUL in target", head("GET /\x00 HTTP/1.1", "Host: a"), 400},
	{"obs-text in target", head("GET /\xe9 HTTP/1.1", "Host: a"), 400},
	{"fragment in target", head("GET /a#b HTTP/1.1", "Host: a"), 400},
	{"backslash in target", head("GET /a\\..\\admin HTTP/1.1", "Host: a"), 400},
	{"bad percent-encoding", head("GET /%zz HTTP/1.1", "Host: a"), 400},
	{"truncated percent-encoding", head("GET /a% HTTP/1.1", "Host: a"), 400},
	{"bad percent-encoding before the query", head("GET /%2?%41 HTTP/1.1", "Host: a"), 400},
	{"relative target", head("GET a/b HTTP/1.1", "Host: a"), 400},
	{"asterisk for GET", head("GET * HTTP/1.1", "Host: a"), 400},
	{"authority-form for GET", head("GET a:80 HTTP/1.1", "Host: a"), 400},
	{"origin-form for CONNECT", head("CONNECT / HTTP/1.1", "Host: a"), 400},
	{"absolute-form for CONNECT", head("CONNECT http://a:443/ HTTP/1.1", "Host: a"), 400},
	{"CONNECT with Content-Length", head("CONNECT a:443 HTTP/1.1", "Host: a:443", "Content-Length: 5"), 400},
	{"CONNECT chunked", head("CONNECT a:443 HTTP/1.1", "Host: a:443", "Transfer-Encoding: chunked"), 400},
	{"CONNECT without port", head("CONNECT a HTTP/1.1", "Host: a"), 400},
	{"ftp scheme", head("GET ftp://a/ HTTP/1.1", "Host: a"), 400},
	{"absolute-form with userinfo", head("GET http://u@a/ HTTP/1.1", "Host: a"), 400},
	{"absolute-form without host", head("GET http:/// HTTP/1.1", "Host: a"), 400},
	// Connection, Upgrade, Trailer
	{"Connection with a non-token", head("GET / HTTP/1.1", "Host: a", "Connection: clo se"), 400},
	{"two Upgrade fields", head("GET / HTTP/1.1", "Host: a", "Connection: upgrade", "Upgrade: a", "Upgrade: b"), 400},
	{"empty Upgrade", head("GET / HTTP/1.1", "Host: a", "Connection: upgrade", "Upgrade: "), 400},
	{"Trailer naming Content-Length", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Trailer: content-length"), 400},
	{"Trailer naming Transfer-Encoding", head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Trailer: X, Transfer-Encoding"), 400},
}

func TestRequestRejections(t *testing.T) {
	for _, tc := range requestRejections {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			err := r.Parse([]byte(tc.in), Limits{})
			if got := statusOf(t, err); got != tc.status {
				t.Fatalf("Parse(%q) = %v (status %d), want status %d", tc.in, err, got, tc.status)
			}
			if r.HeadLen != 0 || r.NFields != 0 {
				t.Errorf("a rejected head left HeadLen %d NFields %d; the request must be zeroed", r.HeadLen, r.NFields)
			}
		})
	}
}

// TestRequestEarlyRejection: a request line that can no longer become
// valid is refused before its CRLF arrives.
func TestRequestEarlyRejection(t *testing.T) {
	for _, tc := range []requestCase{
		{"TLS handshake", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400},
		{"NUL first", "\x00GET", 400},
		{"tab after method", "GET\t/", 400},
		{"bare CR in target", "GET /a\rb", 400},
		{"bare CR after method", "GET\rx", 400},
		{"bare CR first", "\rGET", 400},
		{"control in target", "GET /\x01", 400},
		{"bad version", "GET / HTTX", 400},
		{"space after version", "GET / HTTP/1.1 ", 400},
		{"CR then garbage after version", "GET / HTTP/1.1\rX", 400},
		// and what may still become a request waits
		{"method only", "OPTIONS", -1},
		{"up to version", "GET /a?b HTTP/1.", -1},
		{"up to CR", "GET / HTTP/1.1\r", -1},
		{"another major, not yet known", "GET / HTTP/2.0", -1},
		{"a lone CR", "\r", -1},
		{"empty", "", -1},
	} {
		var r Request
		if got := statusOf(t, r.Parse([]byte(tc.in), Limits{})); got != tc.status {
			t.Errorf("%s: Parse(%q) status %d, want %d", tc.name, tc.in, got, tc.status)
		}
	}
}

func TestRequestLimits(t *testing.T) {
	longTarget := "/" + strings.Repeat("a", 200)
	lim := Limits{MaxRequestLine: 100, MaxHeadBytes: 1000}
	manyFields := []string{"GET / HTTP/1.1", "Host: a"}
	for i := 0; i < MaxHeaders; i++ {
		manyFields = append(manyFields, "X: y")
	}
	cases := []requestCase{
		{"request line too long", head("GET "+longTarget+" HTTP/1.1", "Host: a"), 414},
		// The request line is refused before its CRLF arrives: a client
		// cannot make the proxy buffer an endless line.
		{"request line too long, incomplete", "GET " + longTarget, 414},
		{"request line just fits", head("GET /"+strings.Repeat("a", 100-len("GET / HTTP/1.1"))+" HTTP/1.1", "Host: a"), 0},
		{"request line one too long", head("GET /"+strings.Repeat("a", 101-len("GET / HTTP/1.1"))+" HTTP/1.1", "Host: a"), 414},
		{"head too large", head("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", 1000)), 431},
		{"head too large, incomplete", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("b", 1000), 431},
		{"too many fields", head(manyFields...), 431},
		{"as many fields as allowed", head(manyFields[:len(manyFields)-1]...), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			l := lim
			if strings.Contains(tc.name, "fields") {
				l = Limits{}
			}
			err := r.Parse([]byte(tc.in), l)
			if got := statusOf(t, err); got != tc.status {
				t.Fatalf("Parse = %v (status %d), want status %d", err, got, tc.status)
			}
		})
	}

	// A head of exactly MaxHeadBytes is accepted, one byte more is not.
	exact := head("GET / HTTP/1.1", "Host: a", "X: ")
	exact = head("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", 1000-len(exact)))
	if len(exact) != 1000 {
		t.Fatalf("test head is %d bytes, want 1000", len(exact))
	}
	var r Request
	if err := r.Parse([]byte(exact), lim); err != nil || r.HeadLen != 1000 {
		t.Fatalf("head of exactly MaxHeadBytes: %v, HeadLen %d", err, r.HeadLen)
	}
	over := head("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", 1001-len(head("GET / HTTP/1.1", "Host: a", "X: "))))
	if got := statusOf(t, r.Parse([]byte(over), lim)); got != 431 {
		t.Fatalf("head of MaxHeadBytes+1: status %d, want 431", got)
	}
	// The defaults apply to a zero Limits.
	huge := head("GET / HTTP/1.1", "Host: a", "X: "+strings.Repeat("b", DefaultMaxHeadBytes))
	if got := statusOf(t, r.Parse([]byte(huge), Limits{})); got != 431 {
		t.Fatalf("head over DefaultMaxHeadBytes: status %d, want 431", got)
	}
	if got := statusOf(t, r.Parse([]byte("GET /"+strings.Repeat("a", DefaultMaxRequestLine)), Limits{})); got != 414 {
		t.Fatalf("request line over DefaultMaxRequestLine: status %d, want 414", got)
	}
}

// field returns the value of the first field named name, and whether it is Hop.
func field(r *Request, buf []byte, name string) (value string, hop, ok bool) {
	for _, f := range r.Fields[:r.NFields] {
		if EqualFold(f.Name.Bytes(buf), name) {
			return string(f.Value.Bytes(buf)), f.Hop, true
		}
	}
	return "", false, false
}

func mustParseRequest(tb testing.TB, in string) (*Request, []byte) {
	tb.Helper()
	buf := []byte(in)
	r := new(Request)
	if err := r.Parse(buf, Limits{}); err != nil {
		tb.Fatalf("Parse(%q): %v", in, err)
	}
	return r, buf
}

func TestRequestAccepted(t *testing.T) {
	t.Run("typical GET", func(t *testing.T) {
		in := head("GET /a/b?c=d HTTP/1.1", "Host: Example.com:8080", "User-Agent: x", "Accept: */*  ", "X-Empty:", "X-Obs: caf\xe9")
		r, buf := mustParseRequest(t, in)
		if string(r.Method.Bytes(buf)) != "GET" || string(r.Target.Bytes(buf)) != "/a/b?c=d" || r.Minor != 1 {
			t.Errorf("request line: %q %q 1.%d", r.Method.Bytes(buf), r.Target.Bytes(buf), r.Minor)
		}
		if r.HeadLen != len(in) || r.NFields != 5 || r.Framing != FramingNone || r.Close || r.Connect {
			t.Errorf("HeadLen %d (want %d) NFields %d Framing %v Close %v Connect %v", r.HeadLen, len(in), r.NFields, r.Framing, r.Close, r.Connect)
		}
		if string(r.Host.Bytes(buf)) != "Example.com:8080" {
			t.Errorf("Host %q", r.Host.Bytes(buf))
		}
		if v, hop, _ := field(r, buf, "accept"); v != "*/*" || hop {
			t.Errorf("Accept = %q hop %v: OWS must be trimmed and the field forwarded", v, hop)
		}
		if v, _, ok := field(r, buf, "x-empty"); !ok || v != "" {
			t.Errorf("X-Empty = %q, %v", v, ok)
		}
		if v, _, _ := field(r, buf, "x-obs"); v != "caf\xe9" {
			t.Errorf("obs-text value = %q", v)
		}
	})
	t.Run("Content-Length", func(t *testing.T) {
		r, _ := mustParseRequest(t, head("POST / HTTP/1.1", "Host: a", "Content-Length: 0042"))
		if r.Framing != FramingLength || r.ContentLength != 42 {
			t.Errorf("Framing %v ContentLength %d", r.Framing, r.ContentLength)
		}
		r, _ = mustParseRequest(t, head("POST / HTTP/1.1", "Host: a", "Content-Length: 9223372036854775807"))
		if r.ContentLength != 1<<63-1 {
			t.Errorf("ContentLength %d", r.ContentLength)
		}
	})
	t.Run("identical Content-Length values are one length", func(t *testing.T) {
		for _, in := range []string{
			head("POST / HTTP/1.1", "Host: a", "Content-Length: 7", "Content-Length: 7"),
			head("POST / HTTP/1.1", "Host: a", "Content-Length: 7, 7"),
			head("POST / HTTP/1.1", "Host: a", "Content-Length: 7,7", "Content-Length: 7"),
		} {
			r, buf := mustParseRequest(t, in)
			if r.Framing != FramingLength || r.ContentLength != 7 {
				t.Errorf("%q: Framing %v ContentLength %d", in, r.Framing, r.ContentLength)
			}
			if _, hop, _ := field(r, buf, "content-length"); !hop {
				t.Errorf("Content-Length must be Hop: the forwarder writes its own")
			}
		}
	})
	t.Run("chunked", func(t *testing.T) {
		r, buf := mustParseRequest(t, head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: ChUnKeD", "Trailer: X-Sum"))
		if r.Framing != FramingChunked {
			t.Errorf("Framing %v", r.Framing)
		}
		for _, name := range []string{"transfer-encoding", "trailer"} {
			if _, hop, _ := field(r, buf, name); !hop {
				t.Errorf("%s must be Hop", name)
			}
		}
	})
	t.Run("pipelined", func(t *testing.T) {
		first := head("POST /1 HTTP/1.1", "Host: a", "Content-Length: 3")
		second := head("GET /2 HTTP/1.1", "Host: b")
		buf := []byte(first + "abc" + second + "GET /3 HT")
		var r Request
		if err := r.Parse(buf, Limits{}); err != nil || r.HeadLen != len(first) || r.ContentLength != 3 {
			t.Fatalf("first: %v HeadLen %d (want %d) ContentLength %d", err, r.HeadLen, len(first), r.ContentLength)
		}
		rest := buf[r.HeadLen+3:]
		if err := r.Parse(rest, Limits{}); err != nil || r.HeadLen != len(second) || string(r.Target.Bytes(rest)) != "/2" || string(r.Host.Bytes(rest)) != "b" {
			t.Fatalf("second: %v HeadLen %d (want %d) target %q", err, r.HeadLen, len(second), r.Target.Bytes(rest))
		}
		if err := r.Parse(rest[r.HeadLen:], Limits{}); err != ErrIncomplete {
			t.Fatalf("third, partial: %v, want ErrIncomplete", err)
		}
	})
	t.Run("HTTP/1.0", func(t *testing.T) {
		r, _ := mustParseRequest(t, head("GET / HTTP/1.0"))
		if !r.Close || r.Minor != 0 || r.Host.Len() != 0 {
			t.Errorf("HTTP/1.0 without keep-alive: Close %v Minor %d Host %v", r.Close, r.Minor, r.Host)
		}
		r, buf := mustParseRequest(t, head("GET / HTTP/1.0", "Connection: Keep-Alive", "Keep-Alive: timeout=5", "Expect: 100-continue"))
		if r.Close {
			t.Errorf("HTTP/1.0 keep-alive: Close")
		}
		if r.ExpectContinue {
			t.Errorf("HTTP/1.0 cannot wait for a 100 (RFC 9110 §10.1.1)")
		}
		if _, hop, _ := field(r, buf, "keep-alive"); !hop {
			t.Errorf("Keep-Alive must be Hop")
		}
	})
	t.Run("Connection close and named fields", func(t *testing.T) {
		r, buf := mustParseRequest(t, head("GET / HTTP/1.1", "Host: a", "Connection: , X-Secret ,close,", "x-secret: 1", "Connection: X-Other", "X-Other: 2", "Proxy-Connection: x", "TE: trailers", "X-Keep: 3"))
		if !r.Close {
			t.Errorf("Connection: close not seen")
		}
		for _, name := range []string{"connection", "x-secret", "x-other", "proxy-connection", "te"} {
			if _, hop, ok := field(r, buf, name); !ok || !hop {
				t.Errorf("%s: Hop %v present %v, want Hop", name, hop, ok)
			}
		}
		if _, hop, _ := field(r, buf, "x-keep"); hop {
			t.Errorf("X-Keep is end-to-end but marked Hop")
		}
	})
	t.Run("Upgrade", func(t *testing.T) {
		r, buf := mustParseRequest(t, head("GET /ws HTTP/1.1", "Host: a", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: k"))
		if string(r.Upgrade.Bytes(buf)) != "websocket" || r.Close {
			t.Errorf("Upgrade %q Close %v", r.Upgrade.Bytes(buf), r.Close)
		}
		if _, hop, _ := field(r, buf, "upgrade"); !hop {
			t.Errorf("Upgrade must be Hop")
		}
		r, _ = mustParseRequest(t, head("GET / HTTP/1.1", "Host: a", "Upgrade: h2c, foo/1.0"))
		if r.Upgrade.Len() != 0 {
			t.Errorf("Upgrade without Connection: upgrade must be ignored")
		}
	})
	t.Run("CONNECT", func(t *testing.T) {
		for _, target := range []string{"example.com:443", "[::1]:8443", "1.2.3.4:80"} {
			r, buf := mustParseRequest(t, head("CONNECT "+target+" HTTP/1.1", "Host: "+target))
			if !r.Connect || string(r.Target.Bytes(buf)) != target || r.Framing != FramingNone {
				t.Errorf("CONNECT %s: Connect %v target %q framing %v", target, r.Connect, r.Target.Bytes(buf), r.Framing)
			}
		}
	})
	t.Run("Expect", func(t *testing.T) {
		r, buf := mustParseRequest(t, head("PUT /f HTTP/1.1", "Host: a", "Content-Length: 10", "Expect: 100-Continue"))
		if !r.ExpectContinue {
			t.Errorf("ExpectContinue not set")
		}
		if _, hop, _ := field(r, buf, "expect"); hop {
			t.Errorf("Expect must be forwarded")
		}
	})
	t.Run("absolute-form", func(t *testing.T) {
		r, buf := mustParseRequest(t, head("GET HTTPS://Example.COM:443/p?q HTTP/1.1", "Host: example.com:443"))
		if string(r.Target.Bytes(buf)) != "HTTPS://Example.COM:443/p?q" {
			t.Errorf("target %q", r.Target.Bytes(buf))
		}
		mustParseRequest(t, head("GET http://a?x HTTP/1.1", "Host: a"))
		mustParseRequest(t, head("GET http://[2001:db8::1]:80 HTTP/1.0"))
	})
	t.Run("odd but harmless targets", func(t *testing.T) {
		for _, target := range []string{"/a?off=10%", "/a?q=%zz", "/a|b{c}\"d\"", "/a?b?c", "/%2F%00"} {
			r, buf := mustParseRequest(t, head("GET "+target+" HTTP/1.1", "Host: a"))
			if string(r.Target.Bytes(buf)) != target {
				t.Errorf("target %q, want %q", r.Target.Bytes(buf), target)
			}
		}
	})
	t.Run("OPTIONS *", func(t *testing.T) {
		mustParseRequest(t, head("OPTIONS * HTTP/1.1", "Host: a"))
	})
	t.Run("reuse overwrites", func(t *testing.T) {
		r, _ := mustParseRequest(t, head("POST / HTTP/1.1", "Host: a", "Connection: close, upgrade", "Upgrade: x", "Content-Length: 4", "Expect: 100-continue"))
		buf := []byte(head("GET / HTTP/1.1", "Host: b"))
		if err := r.Parse(buf, Limits{}); err != nil {
			t.Fatal(err)
		}
		if r.Close || r.Upgrade.Len() != 0 || r.Framing != FramingNone || r.ContentLength != 0 || r.ExpectContinue || r.NFields != 1 {
			t.Errorf("state left over from the previous request: %s", summary(r))
		}
	})
}

// TestRequestIncremental feeds valid heads one byte at a time: every
// prefix is ErrIncomplete, and the whole gives what parsing it at once gives.
func TestRequestIncremental(t *testing.T) {
	for _, in := range []string{
		head("GET /a HTTP/1.1", "Host: a", "Connection: keep-alive, x", "X: y", "Content-Length: 12"),
		head("POST /u HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Expect: 100-continue"),
		head("GET / HTTP/1.0"),
	} {
		want, _ := mustParseRequest(t, in)
		var r Request
		for i := 0; i < len(in); i++ {
			if err := r.Parse([]byte(in[:i]), Limits{}); err != ErrIncomplete {
				t.Fatalf("prefix %q: %v, want ErrIncomplete", in[:i], err)
			}
		}
		if err := r.Parse([]byte(in), Limits{}); err != nil {
			t.Fatal(err)
		}
		if r != *want {
			t.Errorf("%q: byte at a time gave %s, at once %s", in, summary(&r), summary(want))
		}
	}
}

func TestErrorText(t *testing.T) {
	var r Request
	err := r.Parse([]byte(head("GET / HTTP/1.1", "Host: a", "X: a", " b")), Limits{})
	if err == nil || err.Error() != "http1: obs-fold in header field" {
		t.Fatalf("error text %q", err)
	}
	var resp Response
	err = resp.Parse([]byte(head("HTTP/1.1 200 OK", "X: a", " b")), Limits{}, []byte("GET"))
	var e *Error
	if !errors.As(err, &e) || e.Status != 502 || !strings.Contains(e.Reason, "obs-fold") {
		t.Fatalf("response error %v, want a 502 naming obs-fold", err)
	}
	for code := errCode(2); code < numErrCodes; code++ {
		if errText[code].reason == "" || errText[code].status == 0 {
			t.Errorf("error code %d has no text", code)
		}
	}
}

// summary is a Request without its Fields array, for messages.
func summary(r *Request) string {
	c := *r
	c.Fields = [MaxHeaders]Field{}
	return fmt.Sprintf("%+v", c)
}
