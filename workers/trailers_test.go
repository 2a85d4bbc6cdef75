package workers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
)

// A client's request trailer may not say what its head may not: the
// forwarding fields the proxy sets, credentials, framing, routing,
// request modifiers, content metadata, hop-by-hop fields (RFC 9110
// §6.5.1). A backend that merges trailers into the header section would
// otherwise trust a forged identity sent after the body.

// forgedTrailers are sent after the body by an HTTP/1.1 client, every
// one of them a field the chunked decoder lets pass (it refuses framing
// and connection fields with 400 itself).
var forgedTrailers = []string{
	"X-Forwarded-For", "10.0.0.1",
	"X_Forwarded_For", "10.0.0.2",
	"X-Forwarded-Proto", "https",
	"X-Forwarded-Host", "evil.example",
	"Forwarded", "for=10.0.0.1;proto=https",
	"X-Real-IP", "10.0.0.1",
	"x-request-id", "forged",
	"Proxy-Authorization", "Basic Zm9vOmJhcg==",
	"Authorization", "Bearer forged",
	"Max-Forwards", "0",
	"If-None-Match", `"x"`,
	"If-Modified-Since", "Mon, 01 Jan 2024 00:00:00 GMT",
	"Range", "bytes=0-1",
	"Content-Type", "text/evil",
	"Content-Encoding", "gzip",
	"Cache-Control", "no-cache",
	"HTTP2-Settings", "AAMAAABkAAQAAP__",
}

// forgedH2Trailers are what an HTTP/2 client sends: those, and the
// framing and routing fields HTTP/2 does not call malformed in a
// trailer block.
var forgedH2Trailers = append([]string{
	"host", "other.example",
	"content-length", "5",
	"trailer", "x-forwarded-for",
	"expect", "100-continue",
}, forgedTrailers...)

// forgedH1Trailers adds X-Hop, which the head's Connection names.
var forgedH1Trailers = append([]string{"X-Hop", "named-in-connection"}, forgedTrailers...)

// sendH1Trailers sends a chunked POST whose trailer carries fields and
// X-Checksum, and returns the status.
func sendH1Trailers(t *testing.T, addr string, fields []string) int {
	t.Helper()
	raw := "POST /t HTTP/1.1\r\nHost: a.example\r\nConnection: close, X-Hop\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
	for i := 0; i+1 < len(fields); i += 2 {
		raw += fields[i] + ": " + fields[i+1] + "\r\n"
	}
	raw += "X-Checksum: abc\r\n\r\n"
	return rawRequest(t, addr, raw).StatusCode
}

// sendH2Trailers sends a POST on a raw HTTP/2 connection: head, DATA,
// then a trailer block with fields and x-checksum; it returns the status.
func sendH2Trailers(t *testing.T, addr string, fields []string) int {
	t.Helper()
	rc := dialRawH2(t, addr)
	rc.hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "a.example"}, {":path", "/t"}} {
		rc.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteData(1, false, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	rc.hb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		rc.enc.WriteField(hpack.HeaderField{Name: strings.ToLower(fields[i]), Value: fields[i+1]})
	}
	rc.enc.WriteField(hpack.HeaderField{Name: "x-checksum", Value: "abc"})
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			var status int
			fmt.Sscan(f.PseudoValue("status"), &status)
			return status
		case *http2.RSTStreamFrame:
			t.Fatalf("the proxy reset the stream: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("the proxy sent GOAWAY: %v", f.ErrCode)
		}
	}
}

// checkTrailerFields: of the fields in got (a trailer the backend saw,
// any case), x-checksum: abc is there and nothing else is.
func checkTrailerFields(t *testing.T, got []hpack.HeaderField) {
	t.Helper()
	checksum := false
	for _, f := range got {
		if strings.EqualFold(f.Name, "x-checksum") && f.Value == "abc" {
			checksum = true
			continue
		}
		t.Errorf("trailer field %s: %q reached the backend", f.Name, f.Value)
	}
	if !checksum {
		t.Errorf("the ordinary trailer field X-Checksum did not reach the backend (got %v)", got)
	}
}

func headerFields(h http.Header) []hpack.HeaderField {
	var out []hpack.HeaderField
	for k, vs := range h {
		for _, v := range vs {
			out = append(out, hpack.HeaderField{Name: k, Value: v})
		}
	}
	return out
}

// TestRequestTrailersFilteredToHTTP1: through an HTTP/1.1 and an HTTP/2
// client to an HTTP/1.1 backend, exactly the ordinary trailer field
// arrives, and the head's X-Forwarded-For is the proxy's.
func TestRequestTrailersFilteredToHTTP1(t *testing.T) {
	for _, clientHTTP2 := range []bool{false, true} {
		name := map[bool]string{false: "HTTP/1.1 to HTTP/1.1", true: "HTTP/2 to HTTP/1.1"}[clientHTTP2]
		t.Run(name, func(t *testing.T) {
			be, seen := recordingBackend(t)
			m := startManager(t, proxyConfig(be, h2cListener), 1)
			var status int
			if clientHTTP2 {
				status = sendH2Trailers(t, addr(t, m, "web"), forgedH2Trailers)
			} else {
				status = sendH1Trailers(t, addr(t, m, "web"), forgedH1Trailers)
			}
			if status != 200 {
				t.Fatalf("status %d, want 200", status)
			}
			var s seenRequest
			select {
			case s = <-seen:
			case <-time.After(10 * time.Second):
				t.Fatal("the backend saw no request")
			}
			if s.body != "hello" {
				t.Errorf("body %q, want hello", s.body)
			}
			checkTrailerFields(t, headerFields(s.trailer))
			if got := s.header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
				t.Errorf("X-Forwarded-For %q, want the proxy's 127.0.0.1", got)
			}
		})
	}
}

// TestRequestTrailersFilteredToHTTP2: the same to an HTTP/2 backend
// that records every field of every HEADERS frame: an HTTP/1.1 client's
// chunked trailer becomes the stream's trailing HEADERS, in lower case.
func TestRequestTrailersFilteredToHTTP2(t *testing.T) {
	for _, clientHTTP2 := range []bool{false, true} {
		name := map[bool]string{false: "HTTP/1.1 to HTTP/2", true: "HTTP/2 to HTTP/2"}[clientHTTP2]
		t.Run(name, func(t *testing.T) {
			be := newScriptedH2(t, func(int64) (http2.ErrCode, bool) { return 0, false })
			m := startManager(t, h2ClusterConfig(func(*config.Route) {}, be.addr), 1)
			var status int
			if clientHTTP2 {
				status = sendH2Trailers(t, addr(t, m, "web"), forgedH2Trailers)
			} else {
				status = sendH1Trailers(t, addr(t, m, "web"), forgedH1Trailers)
			}
			if status != 200 {
				t.Fatalf("status %d, want 200", status)
			}
			var head, trailer []hpack.HeaderField
			select {
			case head = <-be.headers:
			case <-time.After(10 * time.Second):
				t.Fatal("the backend saw no request")
			}
			select {
			case trailer = <-be.headers:
			case <-time.After(10 * time.Second):
				t.Fatal("the backend saw no trailing HEADERS")
			}
			var xff []string
			for _, f := range head {
				if f.Name == "x-forwarded-for" {
					xff = append(xff, f.Value)
				}
			}
			if len(xff) != 1 || xff[0] != "127.0.0.1" {
				t.Errorf("x-forwarded-for %q, want the proxy's 127.0.0.1", xff)
			}
			checkTrailerFields(t, trailer)
			for _, f := range trailer {
				if f.Name != strings.ToLower(f.Name) {
					t.Errorf("trailer field %q is not in lower case, as HTTP/2 wants it", f.Name)
				}
			}
		})
	}
}

// TestRequestTrailerFramingRefused: an HTTP/1.1 client's trailer with a
// framing or connection field is refused by the chunked decoder (400),
// as before: the rewriting does not loosen it.
func TestRequestTrailerFramingRefused(t *testing.T) {
	be, _ := recordingBackend(t)
	m := startManager(t, proxyConfig(be), 1)
	for _, f := range []string{"Content-Length: 5", "Transfer-Encoding: chunked", "Host: other", "Connection: close", "TE: trailers", "Trailer: X", "Expect: 100-continue"} {
		c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "POST /t HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"+f+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if resp.StatusCode != 400 {
			t.Errorf("trailer %s: status %d, want 400", f, resp.StatusCode)
		}
	}
}

// TestResponseTrailersFilteredH2ToH2: an HTTP/2 upstream's response
// trailer reaches an HTTP/2 client without framing or routing fields
// (content-length, host, trailer), with grpc-status and grpc-message.
func TestResponseTrailersFilteredH2ToH2(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		pre := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, pre); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		fr.WriteSettings()
		var hb strings.Builder
		enc := hpack.NewEncoder(&hb)
		block := func(fields ...string) []byte {
			hb.Reset()
			for i := 0; i+1 < len(fields); i += 2 {
				enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
			}
			return []byte(hb.String())
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				if !f.StreamEnded() {
					continue
				}
				id := f.StreamID
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":status", "200", "content-type", "application/grpc"), EndHeaders: true})
				fr.WriteData(id, false, []byte("ok"))
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: block(
					"grpc-status", "0", "grpc-message", "fine", "content-length", "99", "host", "evil.example", "trailer", "x")})
			}
		}
	})
	cfg := proxyConfig(be, h2cListener)
	cfg.Clusters[0].HTTP2 = true
	m := startManager(t, cfg, 1)
	rc := dialRawH2(t, addr(t, m, "web"))
	rc.get(t, 1, "a.example", "/svc", "te", "trailers")
	var blocks [][]hpack.HeaderField
	for len(blocks) < 2 {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the response: %v (blocks so far %v)", err, blocks)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			blocks = append(blocks, f.Fields)
			if f.StreamEnded() && len(blocks) < 2 {
				t.Fatalf("the response ended without trailers: %v", blocks)
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("the proxy reset the stream: %v", f.ErrCode)
		}
	}
	got := map[string]string{}
	for _, f := range blocks[1] {
		got[f.Name] = f.Value
	}
	if got["grpc-status"] != "0" || got["grpc-message"] != "fine" || len(got) != 2 {
		t.Fatalf("trailers %v, want grpc-status and grpc-message alone", got)
	}
}
