package http1

import (
	"strings"
	"testing"
)

func TestResponseRejections(t *testing.T) {
	cases := []struct {
		name string
		in   string
	}{
		{"CL and TE", head("HTTP/1.1 200 OK", "Content-Length: 5", "Transfer-Encoding: chunked")},
		{"CL and TE on a 204", head("HTTP/1.1 204 No Content", "Content-Length: 5", "Transfer-Encoding: chunked")},
		{"TE gzip", head("HTTP/1.1 200 OK", "Transfer-Encoding: gzip")},
		{"TE list", head("HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked")},
		{"TE twice", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked")},
		{"TE in HTTP/1.0", head("HTTP/1.0 200 OK", "Transfer-Encoding: chunked")},
		{"TE space before colon", head("HTTP/1.1 200 OK", "Transfer-Encoding : chunked")},
		{"CL differing", head("HTTP/1.1 200 OK", "Content-Length: 1", "Content-Length: 2")},
		{"CL plus", head("HTTP/1.1 200 OK", "Content-Length: +1")},
		{"CL bad on a HEAD response", head("HTTP/1.1 200 OK", "Content-Length: x")},
		{"obs-fold", head("HTTP/1.1 200 OK", "X: a", " b")},
		{"bare LF", "HTTP/1.1 200 OK\nX: a\r\n\r\n"},
		{"bare CR", head("HTTP/1.1 200 OK", "X: a\rb")},
		{"NUL", head("HTTP/1.1 200 OK", "X: a\x00")},
		{"status 99", head("HTTP/1.1 099 Low")},
		{"status 600", head("HTTP/1.1 600 High")},
		{"status two digits", head("HTTP/1.1 20 OK")},
		{"status four digits", head("HTTP/1.1 2000 OK")},
		{"status with sign", head("HTTP/1.1 +20 OK")},
		{"two spaces before status", head("HTTP/1.1  200 OK")},
		{"tab after status", head("HTTP/1.1 200\tOK")},
		{"HTTP/2.0", head("HTTP/2.0 200 OK")},
		{"HTTP/1.2", head("HTTP/1.2 200 OK")},
		{"lowercase version", head("http/1.1 200 OK")},
		{"control in reason", head("HTTP/1.1 200 O\x01K")},
		{"empty line first", "\r\n" + head("HTTP/1.1 200 OK")},
		{"too many fields", head(append([]string{"HTTP/1.1 200 OK"}, strings.Split(strings.Repeat("X: y\n", MaxHeaders+1), "\n")[:MaxHeaders+1]...)...)},
		{"head too large", head("HTTP/1.1 200 OK", "X: "+strings.Repeat("y", DefaultMaxHeadBytes))},
		{"head too large, incomplete", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("y", DefaultMaxHeadBytes)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r Response
			method := []byte("GET")
			if strings.Contains(tc.name, "HEAD") {
				method = []byte("HEAD")
			}
			err := r.Parse([]byte(tc.in), Limits{}, method)
			if got := statusOf(t, err); got != 502 {
				t.Fatalf("Parse(%q) = %v (status %d), want 502", tc.in, err, got)
			}
		})
	}
}

func TestResponseFraming(t *testing.T) {
	cases := []struct {
		name      string
		method    string
		in        string
		framing   Framing
		length    int64
		close     bool
		minor     uint8
		status    int
		reason    string
		nfields   int
		hopFields []string
	}{
		{"length", "GET", head("HTTP/1.1 200 OK", "Content-Length: 12"), FramingLength, 12, false, 1, 200, "OK", 1, []string{"content-length"}},
		{"chunked", "GET", head("HTTP/1.1 201 Created", "Transfer-Encoding: chunked", "Connection: close"), FramingChunked, 0, true, 1, 201, "Created", 2, []string{"transfer-encoding", "connection"}},
		{"until close", "POST", head("HTTP/1.1 200 OK"), FramingUntilClose, 0, true, 1, 200, "OK", 0, nil},
		{"HTTP/1.0 keep-alive", "GET", head("HTTP/1.0 200 OK", "Connection: keep-alive", "Content-Length: 0"), FramingLength, 0, false, 0, 200, "OK", 2, []string{"connection"}},
		{"HTTP/1.0 closes", "GET", head("HTTP/1.0 200 OK", "Content-Length: 3"), FramingLength, 3, true, 0, 200, "OK", 1, nil},
		{"HEAD with length", "HEAD", head("HTTP/1.1 200 OK", "Content-Length: 100"), FramingNone, 0, false, 1, 200, "OK", 1, nil},
		{"HEAD with chunked", "HEAD", head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"), FramingNone, 0, false, 1, 200, "OK", 1, nil},
		{"204 with length", "GET", head("HTTP/1.1 204 No Content", "Content-Length: 5"), FramingNone, 0, false, 1, 204, "No Content", 1, nil},
		{"304", "GET", head("HTTP/1.1 304 Not Modified", "Transfer-Encoding: chunked"), FramingNone, 0, false, 1, 304, "Not Modified", 1, nil},
		{"100", "POST", head("HTTP/1.1 100 Continue"), FramingNone, 0, false, 1, 100, "Continue", 0, nil},
		{"101", "GET", head("HTTP/1.1 101 Switching Protocols", "Connection: Upgrade", "Upgrade: websocket"), FramingNone, 0, false, 1, 101, "Switching Protocols", 2, []string{"upgrade", "connection"}},
		{"2xx to CONNECT", "CONNECT", head("HTTP/1.1 200 Connection Established", "Content-Length: 9"), FramingNone, 0, false, 1, 200, "Connection Established", 1, nil},
		{"407 to CONNECT has a body", "CONNECT", head("HTTP/1.1 407 Proxy Auth", "Content-Length: 9"), FramingLength, 9, false, 1, 407, "Proxy Auth", 1, nil},
		{"no reason", "GET", head("HTTP/1.1 404", "Content-Length: 0"), FramingLength, 0, false, 1, 404, "", 1, nil},
		{"empty reason", "GET", head("HTTP/1.1 404 ", "Content-Length: 0"), FramingLength, 0, false, 1, 404, "", 1, nil},
		{"reason with obs-text and spaces", "GET", head("HTTP/1.1 500 Erreur  interne \xe9", "Content-Length: 0"), FramingLength, 0, false, 1, 500, "Erreur  interne \xe9", 1, nil},
		{"Host is an ordinary field in a response", "GET", head("HTTP/1.1 200 OK", "Host: not/an authority", "Host: twice", "Content-Length: 0"), FramingLength, 0, false, 1, 200, "OK", 3, nil},
		{"identical lengths", "GET", head("HTTP/1.1 200 OK", "Content-Length: 4", "content-length: 4"), FramingLength, 4, false, 1, 200, "OK", 2, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			buf := []byte(tc.in + "body")
			var r Response
			if err := r.Parse(buf, Limits{}, []byte(tc.method)); err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if r.Framing != tc.framing || r.ContentLength != tc.length || r.Close != tc.close {
				t.Errorf("Framing %v ContentLength %d Close %v, want %v %d %v", r.Framing, r.ContentLength, r.Close, tc.framing, tc.length, tc.close)
			}
			if r.Minor != tc.minor || r.Status != tc.status || string(r.Reason.Bytes(buf)) != tc.reason || r.NFields != tc.nfields || r.HeadLen != len(tc.in) {
				t.Errorf("Minor %d Status %d Reason %q NFields %d HeadLen %d", r.Minor, r.Status, r.Reason.Bytes(buf), r.NFields, r.HeadLen)
			}
			for _, name := range tc.hopFields {
				found := false
				for _, f := range r.Fields[:r.NFields] {
					if EqualFold(f.Name.Bytes(buf), name) {
						found = f.Hop
					}
				}
				if !found {
					t.Errorf("%s is not Hop", name)
				}
			}
		})
	}
}

func TestResponseIncremental(t *testing.T) {
	in := head("HTTP/1.1 200 OK", "Content-Type: text/plain", "Transfer-Encoding: chunked", "Connection: keep-alive")
	var want, r Response
	if err := want.Parse([]byte(in), Limits{}, []byte("GET")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(in); i++ {
		if err := r.Parse([]byte(in[:i]), Limits{}, []byte("GET")); err != ErrIncomplete {
			t.Fatalf("prefix %q: %v, want ErrIncomplete", in[:i], err)
		}
	}
	if err := r.Parse([]byte(in), Limits{}, []byte("GET")); err != nil || r != want {
		t.Fatalf("byte at a time: %v, result differs: %v", err, r != want)
	}
}
