package http1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

// The differential fuzz targets hold this package to one promise: whatever
// it accepts, net/http accepts too and reads the same way (method, target,
// version, Host, framing, Close, fields, chunked payload). Being stricter
// than net/http is allowed (it is the point); being laxer is a bug, except
// for these deliberate exceptions, each safe because it leaves the message
// boundaries unambiguous:
//
//  1. Content-Length written as a list of identical values ("5, 5"):
//     RFC 9110 §8.6 lets a recipient take it as one length; net/http
//     refuses a comma in the value. The length is the same whichever way
//     it is read, and the forwarder writes its own Content-Length.
//  2. A trailer section over 4 KiB (we take up to 8 KiB): net/http can only
//     look that far ahead in its read buffer. The end of the trailer is
//     still where both say it is.

// realisticRequests seed both fuzzers' corpora alongside the table cases.
var realisticRequests = []string{
	browserGET,
	head("POST /api/v1/items HTTP/1.1", "Host: api.example.com", "Content-Type: application/json", "Content-Length: 13") + `{"a":"hello"}`,
	head("POST /upload HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Trailer: X-Sum") + "5;ext=1\r\nhello\r\n0\r\nX-Sum: 9\r\n\r\n",
	head("PUT /f HTTP/1.1", "Host: a:8080", "Expect: 100-continue", "Content-Length: 3") + "abc",
	head("GET /ws HTTP/1.1", "Host: a", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13"),
	head("CONNECT example.com:443 HTTP/1.1", "Host: example.com:443"),
	head("OPTIONS * HTTP/1.1", "Host: a"),
	head("GET http://a.example/x?y HTTP/1.1", "Host: A.example"),
	head("GET / HTTP/1.0", "Connection: keep-alive"),
	head("GET / HTTP/1.1", "Host: [::1]:80", "Pragma: no-cache", "Connection: close, X-A", "X-A: 1"),
	head("DELETE /x HTTP/1.1", "Host: a", "Content-Length: 0", "Content-Length: 0"),
}

var realisticResponses = []string{
	typicalResponse + strings.Repeat("x", 64),
	head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Trailer: X-Sum") + "a\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n",
	head("HTTP/1.1 204 No Content", "Connection: close"),
	head("HTTP/1.1 304 Not Modified", "ETag: \"x\""),
	head("HTTP/1.0 200 OK", "Content-Type: text/plain") + "until close",
	head("HTTP/1.1 101 Switching Protocols", "Connection: Upgrade", "Upgrade: websocket"),
	head("HTTP/1.1 404", "Content-Length: 0"),
	head("HTTP/1.1 500 Internal Server Error", "Content-Length: 5", "Connection: keep-alive") + "oops!",
	head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + "3;a=\"b\"\r\nabc\r\n0\r\n\r\n",
	head("HTTP/1.1 200 OK", "Pragma: no-cache", "Content-Length: 1") + "x",
}

func FuzzRequestVsNetHTTP(f *testing.F) {
	for _, tc := range requestRejections {
		f.Add([]byte(tc.in))
	}
	for _, s := range realisticRequests {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Request
		if err := r.Parse(data, Limits{}); err != nil {
			checkParseError(t, err)
			return
		}
		checkSpans(t, data, r.HeadLen, r.Fields[:r.NFields])
		// The head alone parses the same, and no prefix of it is a head.
		var alone Request
		if err := alone.Parse(data[:r.HeadLen], Limits{}); err != nil || alone != r {
			t.Fatalf("the head alone: %v, or a different result", err)
		}
		for _, p := range []int{r.HeadLen - 1, r.HeadLen - 2, r.HeadLen / 2} {
			if err := alone.Parse(data[:p], Limits{}); err != ErrIncomplete {
				t.Fatalf("prefix of %d bytes of a valid head: %v, want ErrIncomplete", p, err)
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			if hasCommaContentLength(data, r.Fields[:r.NFields]) {
				return // exception 1
			}
			t.Fatalf("we accept a request net/http rejects (%v):\n%q", err, data[:r.HeadLen])
		}
		if got := string(r.Method.Bytes(data)); got != req.Method {
			t.Errorf("method %q, net/http %q", got, req.Method)
		}
		target := string(r.Target.Bytes(data))
		if target != req.RequestURI {
			t.Errorf("target %q, net/http %q", target, req.RequestURI)
		}
		if req.ProtoMajor != 1 || int(r.Minor) != req.ProtoMinor {
			t.Errorf("version 1.%d, net/http %d.%d", r.Minor, req.ProtoMajor, req.ProtoMinor)
		}
		host := string(r.Host.Bytes(data))
		if authority, ok := splitAbsoluteForm(r.Target.Bytes(data)); ok {
			host = string(authority) // net/http takes the target's; we checked they agree
		} else if r.Connect {
			host = target
		}
		if !strings.EqualFold(host, req.Host) {
			t.Errorf("host %q, net/http %q", host, req.Host)
		}
		switch r.Framing {
		case FramingChunked:
			if !slices.Equal(req.TransferEncoding, []string{"chunked"}) {
				t.Errorf("chunked, net/http: Transfer-Encoding %q, length %d", req.TransferEncoding, req.ContentLength)
			}
		case FramingLength, FramingNone:
			if req.TransferEncoding != nil || req.ContentLength != r.ContentLength {
				t.Errorf("%v %d, net/http: Transfer-Encoding %q, length %d", r.Framing, r.ContentLength, req.TransferEncoding, req.ContentLength)
			}
		default:
			t.Errorf("request framing %v", r.Framing)
		}
		if r.Close != req.Close {
			t.Errorf("Close %v, net/http %v", r.Close, req.Close)
		}
		compareFields(t, data, r.Fields[:r.NFields], req.Header, false)
		if r.Framing == FramingChunked {
			compareChunkedBody(t, data[r.HeadLen:], req.Body, func() http.Header { return req.Trailer })
		}
	})
}

func FuzzResponseVsNetHTTP(f *testing.F) {
	for _, s := range realisticResponses {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	for _, s := range requestRejections { // their field lines are as good a seed for responses
		if i := strings.Index(s.in, "\r\n"); i >= 0 {
			f.Add(false, []byte("HTTP/1.1 200 OK"+s.in[i:]))
		}
	}
	f.Fuzz(func(t *testing.T, toHEAD bool, data []byte) {
		method := "GET"
		if toHEAD {
			method = "HEAD"
		}
		var r Response
		if err := r.Parse(data, Limits{}, []byte(method)); err != nil {
			checkParseError(t, err)
			return
		}
		checkSpans(t, data, r.HeadLen, r.Fields[:r.NFields])
		var alone Response
		if err := alone.Parse(data[:r.HeadLen], Limits{}, []byte(method)); err != nil || alone != r {
			t.Fatalf("the head alone: %v, or a different result", err)
		}
		for _, p := range []int{r.HeadLen - 1, r.HeadLen - 2, r.HeadLen / 2} {
			if err := alone.Parse(data[:p], Limits{}, []byte(method)); err != ErrIncomplete {
				t.Fatalf("prefix of %d bytes of a valid head: %v, want ErrIncomplete", p, err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), &http.Request{Method: method})
		if err != nil {
			if hasCommaContentLength(data, r.Fields[:r.NFields]) {
				return // exception 1
			}
			t.Fatalf("we accept a response net/http rejects (%v):\n%q", err, data[:r.HeadLen])
		}
		if resp.ProtoMajor != 1 || int(r.Minor) != resp.ProtoMinor || r.Status != resp.StatusCode {
			t.Errorf("HTTP/1.%d %d, net/http HTTP/%d.%d %d", r.Minor, r.Status, resp.ProtoMajor, resp.ProtoMinor, resp.StatusCode)
		}
		if _, reason, _ := strings.Cut(resp.Status, " "); reason != string(r.Reason.Bytes(data)) {
			t.Errorf("reason %q, net/http status %q", r.Reason.Bytes(data), resp.Status)
		}
		switch r.Framing {
		case FramingNone:
			if resp.Body != http.NoBody {
				t.Errorf("no body, net/http: Transfer-Encoding %q, length %d", resp.TransferEncoding, resp.ContentLength)
			}
		case FramingChunked:
			if !slices.Equal(resp.TransferEncoding, []string{"chunked"}) || resp.Body == http.NoBody {
				t.Errorf("chunked, net/http: Transfer-Encoding %q, length %d", resp.TransferEncoding, resp.ContentLength)
			}
		case FramingLength:
			if resp.TransferEncoding != nil || resp.ContentLength != r.ContentLength {
				t.Errorf("length %d, net/http: Transfer-Encoding %q, length %d", r.ContentLength, resp.TransferEncoding, resp.ContentLength)
			}
		case FramingUntilClose:
			if resp.TransferEncoding != nil || resp.ContentLength != -1 || resp.Body == http.NoBody {
				t.Errorf("until close, net/http: Transfer-Encoding %q, length %d", resp.TransferEncoding, resp.ContentLength)
			}
		}
		if r.Close != resp.Close {
			t.Errorf("Close %v, net/http %v", r.Close, resp.Close)
		}
		compareFields(t, data, r.Fields[:r.NFields], resp.Header, true)
		if r.Framing == FramingChunked {
			compareChunkedBody(t, data[r.HeadLen:], resp.Body, func() http.Header { return resp.Trailer })
		}
	})
}

// checkParseError fails unless err is ErrIncomplete or an *Error with a
// status a server may answer.
func checkParseError(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrIncomplete) {
		return
	}
	var e *Error
	if !errors.As(err, &e) || e.Reason == "" {
		t.Fatalf("error %v (%T) is neither ErrIncomplete nor an *Error", err, err)
	}
	switch e.Status {
	case 400, 414, 431, 501, 505, 502:
	default:
		t.Fatalf("error status %d", e.Status)
	}
}

// checkSpans fails unless every span lies inside the head.
func checkSpans(t *testing.T, data []byte, headLen int, fields []Field) {
	t.Helper()
	if headLen < 4 || headLen > len(data) || string(data[headLen-4:headLen]) != "\r\n\r\n" {
		t.Fatalf("HeadLen %d of %d bytes does not end in CRLF CRLF", headLen, len(data))
	}
	for _, f := range fields {
		for _, s := range []Span{f.Name, f.Value} {
			if s.Start < 0 || s.Start > s.End || int(s.End) > headLen {
				t.Fatalf("span %v outside the head of %d bytes", s, headLen)
			}
		}
	}
}

// hasCommaContentLength reports whether a Content-Length field holds a list
// (exception 1).
func hasCommaContentLength(data []byte, fields []Field) bool {
	for _, f := range fields {
		if EqualFold(f.Name.Bytes(data), "content-length") && bytes.IndexByte(f.Value.Bytes(data), ',') >= 0 {
			return true
		}
	}
	return false
}

// listHas reports whether any field named name lists token.
func listHas(data []byte, fields []Field, name, token string) bool {
	found := false
	for _, f := range fields {
		if EqualFold(f.Name.Bytes(data), name) {
			forEachListElement(f.Value.Bytes(data), func(elem []byte) errCode {
				found = found || EqualFold(elem, token)
				return errNone
			})
		}
	}
	return found
}

// compareFields compares our fields with net/http's header as multisets of
// (canonical name, value), leaving out what net/http removes or rewrites.
func compareFields(t *testing.T, data []byte, fields []Field, h http.Header, response bool) {
	t.Helper()
	skip := map[string]bool{"Host": !response, "Transfer-Encoding": true, "Content-Length": true}
	chunked := false
	for _, f := range fields {
		chunked = chunked || EqualFold(f.Name.Bytes(data), "transfer-encoding")
	}
	if chunked {
		skip["Trailer"] = true // net/http moves it to Request/Response.Trailer
	}
	minor1 := bytes.HasPrefix(data, []byte("HTTP/1.1"))
	if response && minor1 && listHas(data, fields, "connection", "close") {
		skip["Connection"] = true // net/http deletes it once it has set Close
	}
	var ours, theirs []string
	hasCacheControl := false
	for _, f := range fields {
		name := textproto.CanonicalMIMEHeaderKey(string(f.Name.Bytes(data)))
		hasCacheControl = hasCacheControl || name == "Cache-Control"
		if !skip[name] {
			ours = append(ours, name+": "+string(f.Value.Bytes(data)))
		}
	}
	for name, values := range h {
		if skip[name] {
			continue
		}
		if name == "Cache-Control" && !hasCacheControl {
			continue // net/http adds it for "Pragma: no-cache"
		}
		for _, v := range values {
			theirs = append(theirs, name+": "+v)
		}
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	if !slices.Equal(ours, theirs) {
		t.Errorf("fields differ:\n ours   %q\n theirs %q", ours, theirs)
	}
}

// compareChunkedBody decodes body with ChunkedDecoder and reads netBody: if
// net/http fails, so must we (but for exception 2); if both succeed, the
// payloads and trailers are the same.
func compareChunkedBody(t *testing.T, body []byte, netBody io.Reader, netTrailer func() http.Header) {
	t.Helper()
	payload, trailer, err := decodeChunked(t, body, nil)
	split := 1
	splitPayload, splitTrailer, splitErr := decodeChunked(t, body, func() int { split = split%7 + 1; return split })
	if (err == nil) != (splitErr == nil) || err == nil && (!bytes.Equal(payload, splitPayload) || !bytes.Equal(trailer, splitTrailer)) {
		t.Fatalf("decoding in pieces differs from decoding at once: %v vs %v", err, splitErr)
	}
	netPayload, netErr := io.ReadAll(netBody)
	if netErr != nil {
		if err == nil && len(trailer) > 4096-4 {
			return // exception 2
		}
		if err == nil {
			t.Fatalf("we decode a chunked body net/http rejects (%v): %q", netErr, body)
		}
		return
	}
	if err != nil {
		return // stricter than net/http: allowed
	}
	if !bytes.Equal(payload, netPayload) {
		t.Fatalf("payload %q, net/http %q", payload, netPayload)
	}
	var ours, theirs []string
	for line := range strings.SplitSeq(string(trailer), "\r\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			ours = append(ours, textproto.CanonicalMIMEHeaderKey(name)+": "+strings.Trim(value, " \t"))
		}
	}
	for name, values := range netTrailer() {
		for _, v := range values {
			theirs = append(theirs, name+": "+v)
		}
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	if !slices.Equal(ours, theirs) {
		t.Fatalf("trailer fields differ:\n ours   %q\n theirs %q", ours, theirs)
	}
}

// chunkedSeeds are bodies for FuzzChunkedVsNetHTTP: the chunked table
// cases, accepted and rejected.
var chunkedSeeds = []string{
	"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
	"5;a;b=c; d = \"e;\\\"f\"\r\nhello\r\n0;last\r\n\r\n",
	"3\r\nabc\r\n0\r\nX-Sum: 1\r\nX-Other:  two \r\n\r\n",
	"00A\r\n0123456789\r\n000\r\n\r\n",
	"0\r\n\r\n",
	"5g\r\nhello\r\n0\r\n\r\n",
	"5\r\nhelloX\r\n0\r\n\r\n",
	"5 ;a\r\nhello\r\n0\r\n\r\n",
	"0\r\nX: a\r\n b\r\n\r\n",
	"ffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
}

// FuzzChunkedVsNetHTTP aims the mutations at the chunked body alone, behind
// a fixed request head, so that they are not spent on heads we reject.
func FuzzChunkedVsNetHTTP(f *testing.F) {
	for _, s := range chunkedSeeds {
		f.Add([]byte(s))
	}
	const reqHead = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(strings.NewReader(reqHead), bytes.NewReader(body))))
		if err != nil {
			t.Fatalf("net/http rejects the fixed head: %v", err)
		}
		compareChunkedBody(t, body, req.Body, func() http.Header { return req.Trailer })
	})
}
