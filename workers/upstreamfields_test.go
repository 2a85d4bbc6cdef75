package workers

import (
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// Issue 20's header decisions, through each of the four request-head
// writers: an HTTP/1.1 or HTTP/2 client, to an HTTP/1.1 or HTTP/2
// upstream.

// fieldsPath is one client protocol and one upstream protocol.
type fieldsPath struct {
	name          string
	clientHTTP2   bool
	upstreamHTTP2 bool
}

var fieldsPaths = []fieldsPath{
	{"HTTP/1.1 to HTTP/1.1", false, false},
	{"HTTP/2 to HTTP/1.1", true, false},
	{"HTTP/1.1 to HTTP/2", false, true},
	{"HTTP/2 to HTTP/2", true, true},
}

// sendThrough starts a proxy for p (trust_forwarded_for = trusted) and
// sends one GET with fields (name, value, ...: repeated names are several
// fields), returning what the backend saw.
func sendThrough(t *testing.T, p fieldsPath, trusted bool, fields ...string) seenRequest {
	t.Helper()
	var be string
	var seen <-chan seenRequest
	if p.upstreamHTTP2 {
		be, seen = h2cBackend(t)
	} else {
		be, seen = recordingBackend(t)
	}
	cfg := proxyConfig(be, h2cListener, func(l *config.Listener) { l.TrustForwardedFor = boolp(trusted) })
	cfg.Clusters[0].HTTP2 = p.upstreamHTTP2
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	if p.clientHTTP2 {
		req := newReq(t, "GET", "http://"+a+"/fields", nil)
		for i := 0; i+1 < len(fields); i += 2 {
			// Not canonicalised: the name goes out as written (x/net
			// lower-cases it on the wire, as HTTP/2 requires).
			req.Header[fields[i]] = append(req.Header[fields[i]], fields[i+1])
		}
		if resp, body := h2Do(t, h2cClient(t), req); resp.StatusCode != 200 {
			t.Fatalf("HTTP/2 GET: %d %q", resp.StatusCode, body)
		}
	} else {
		raw := "GET /fields HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n"
		for i := 0; i+1 < len(fields); i += 2 {
			raw += fields[i] + ": " + fields[i+1] + "\r\n"
		}
		if resp := rawRequest(t, a, raw+"\r\n"); resp.StatusCode != 200 {
			t.Fatalf("HTTP/1.1 GET: %d", resp.StatusCode)
		}
	}
	select {
	case s := <-seen:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the backend saw no request")
	}
	return seenRequest{}
}

// spellings returns the backend's fields whose names fold to lower
// (case aside, '_' for '-'), by the name the backend saw.
func spellings(h http.Header, lower string) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		if strings.EqualFold(strings.ReplaceAll(k, "_", "-"), lower) {
			out[k] = v
		}
	}
	return out
}

// forgedForwarding is what a client sends to pose as another address,
// scheme or host, in the spellings backends fold together.
var forgedForwarding = []string{
	"X-Forwarded-For", "1.2.3.4",
	"X_Forwarded_For", "5.6.7.8",
	"x_forwarded-for", "5.6.7.9",
	"Forwarded", "for=1.2.3.4;proto=https",
	"X-Real-IP", "1.2.3.4",
	"X_Real_IP", "9.9.9.9",
	"X_Forwarded_Proto", "https",
	"X_Forwarded_Host", "evil.example",
	"HTTP2-Settings", "AAMAAABkAAQAAP__",
}

// TestForwardingFieldsNotTrusted: with trust_forwarded_for = false no
// field of the client's that says who it is reaches the backend, in any
// spelling; the backend gets the proxy's X-Forwarded-For alone.
func TestForwardingFieldsNotTrusted(t *testing.T) {
	for _, p := range fieldsPaths {
		t.Run(p.name, func(t *testing.T) {
			s := sendThrough(t, p, false, forgedForwarding...)
			if got := spellings(s.header, "x-forwarded-for"); len(got) != 1 || len(got["X-Forwarded-For"]) != 1 || got["X-Forwarded-For"][0] != "127.0.0.1" {
				t.Errorf("X-Forwarded-For spellings %v, want only X-Forwarded-For: 127.0.0.1", got)
			}
			for _, name := range []string{"forwarded", "x-real-ip", "http2-settings"} {
				if got := spellings(s.header, name); len(got) != 0 {
					t.Errorf("the backend got %v: the client's %s must not reach it", got, name)
				}
			}
			if got := spellings(s.header, "x-forwarded-proto"); len(got) != 1 || got["X-Forwarded-Proto"][0] != "http" {
				t.Errorf("X-Forwarded-Proto spellings %v, want only the proxy's http", got)
			}
			if got := spellings(s.header, "x-forwarded-host"); len(got) != 1 || got["X-Forwarded-Host"][0] == "evil.example" {
				t.Errorf("X-Forwarded-Host spellings %v, want only the proxy's", got)
			}
		})
	}
}

// TestForwardingFieldsTrusted: with trust_forwarded_for = true the
// front proxy's X-Forwarded-For heads the chain and its Forwarded and
// X-Real-IP pass; their '_' spellings never (a front proxy writes '-').
func TestForwardingFieldsTrusted(t *testing.T) {
	for _, p := range fieldsPaths {
		t.Run(p.name, func(t *testing.T) {
			s := sendThrough(t, p, true, forgedForwarding...)
			if got := spellings(s.header, "x-forwarded-for"); len(got) != 1 || strings.Join(got["X-Forwarded-For"], ",") != "1.2.3.4, 127.0.0.1" {
				t.Errorf("X-Forwarded-For spellings %v, want only X-Forwarded-For: 1.2.3.4, 127.0.0.1", got)
			}
			if got := s.header.Get("Forwarded"); got != "for=1.2.3.4;proto=https" {
				t.Errorf("Forwarded %q, want the trusted front proxy's", got)
			}
			if got := spellings(s.header, "x-real-ip"); len(got) != 1 || s.header.Get("X-Real-Ip") != "1.2.3.4" {
				t.Errorf("X-Real-IP spellings %v, want only X-Real-IP: 1.2.3.4", got)
			}
			if got := spellings(s.header, "http2-settings"); len(got) != 0 {
				t.Errorf("the backend got %v", got)
			}
		})
	}
}

// TestRequestIDBounded: a client's X-Request-Id is kept only when it is
// the one X-Request-Id and valid (charset, at most 128 bytes); otherwise
// the backend gets exactly one generated id.
func TestRequestIDBounded(t *testing.T) {
	long := strings.Repeat("a", 4096)
	cases := []struct {
		name   string
		fields []string
		keep   string // the id the backend must get; "": a generated one
	}{
		{"a UUID kept", []string{"X-Request-Id", "4f1c2a9e-8d3b-4c5e-9f70-1a2b3c4d5e6f"}, "4f1c2a9e-8d3b-4c5e-9f70-1a2b3c4d5e6f"},
		{"128 bytes kept", []string{"X-Request-Id", strings.Repeat("b", 128)}, strings.Repeat("b", 128)},
		{"4 KB, twice", []string{"X-Request-Id", long, "X-Request-Id", long}, ""},
		{"129 bytes", []string{"X-Request-Id", strings.Repeat("b", 129)}, ""},
		{"two valid ids", []string{"X-Request-Id", "one", "X-Request-Id", "two"}, ""},
		{"a list", []string{"X-Request-Id", "one, two"}, ""},
		{"a quote", []string{"X-Request-Id", `a"b`}, ""},
		{"empty", []string{"X-Request-Id", ""}, ""},
		{"underscore spelling beside a valid id", []string{"X-Request-Id", "mine", "X_Request_Id", "other"}, "mine"},
		{"underscore spelling alone", []string{"X_Request_Id", "other"}, ""},
	}
	for _, p := range fieldsPaths {
		for _, tc := range cases {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				s := sendThrough(t, p, false, tc.fields...)
				got := spellings(s.header, "x-request-id")
				ids := got["X-Request-Id"]
				if len(got) != 1 || len(ids) != 1 {
					t.Fatalf("X-Request-Id spellings %v, want exactly one X-Request-Id", got)
				}
				switch {
				case tc.keep != "" && ids[0] != tc.keep:
					t.Errorf("X-Request-Id %q, want the client's %q", ids[0], tc.keep)
				case tc.keep == "" && (len(ids[0]) != 32 || strings.Trim(ids[0], "0123456789abcdef") != ""):
					t.Errorf("X-Request-Id %q, want a generated one (32 hex digits)", ids[0])
				}
			})
		}
	}
}

// TestForwardedProtoIsTheConnections: X-Forwarded-Proto says how the
// client reached the proxy, over TLS "https", whatever the HTTP/2
// client's :scheme says, and on the HTTP/1.1 to HTTP/2 path too.
func TestForwardedProtoIsTheConnections(t *testing.T) {
	for _, up2 := range []bool{false, true} {
		var be string
		var seen <-chan seenRequest
		if up2 {
			be, seen = h2cBackend(t)
		} else {
			be, seen = recordingBackend(t)
		}
		cfg := proxyConfig(be, withTLS)
		cfg.Clusters[0].HTTP2 = up2
		m := startTLSManagerALPN(t, cfg, 1, config.ALPNHTTP2, config.ALPNHTTP11)
		a := addr(t, m, "web")
		dial := func(proto string) net.Conn {
			c := clientTLS(t, "a.example.com")
			c.NextProtos = []string{proto}
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a, c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			return conn
		}
		h2 := h2RawExchange(t, dial(config.ALPNHTTP2), [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "a.example"}, {":path", "/"}}, nil)
		if h2.status != 200 {
			t.Fatalf("HTTP/2 over TLS, :scheme http: %+v", h2)
		}
		if s := <-seen; s.header.Get("X-Forwarded-Proto") != "https" {
			t.Errorf("HTTP/2 over TLS with :scheme http, upstream HTTP/2 %v: X-Forwarded-Proto %q, want https", up2, s.header.Get("X-Forwarded-Proto"))
		}
		if got := h1RawStatus(t, dial(config.ALPNHTTP11), "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"); got != 200 {
			t.Fatalf("HTTP/1.1 over TLS: %d", got)
		}
		if s := <-seen; s.header.Get("X-Forwarded-Proto") != "https" {
			t.Errorf("HTTP/1.1 over TLS, upstream HTTP/2 %v: X-Forwarded-Proto %q, want https", up2, s.header.Get("X-Forwarded-Proto"))
		}
	}
}

// TestForwardedForNamedByConnectionIsDropped: an X-Forwarded-For that the
// client's Connection header names is hop-by-hop (RFC 9110 §7.6.1), a
// field for this hop only: even with trust_forwarded_for it does not
// head the chain the upstream gets, on either upstream protocol. (The
// HTTP/1.1 head writers used to leave it out of the fields but put its
// value into X-Forwarded-For all the same; the one writer,
// exchange.ForwardedFields, never sees a hop-by-hop field.)
func TestForwardedForNamedByConnectionIsDropped(t *testing.T) {
	for _, p := range fieldsPaths {
		if p.clientHTTP2 {
			continue // HTTP/2 has no Connection header (x/net refuses one)
		}
		t.Run(p.name, func(t *testing.T) {
			s := sendThrough(t, p, true, "Connection", "X-Forwarded-For", "X-Forwarded-For", "6.6.6.6")
			if got := s.header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
				t.Errorf("X-Forwarded-For %q, want the proxy's alone: 127.0.0.1", got)
			}
		})
	}
}
