package exchange

import (
	"strings"
	"testing"
)

func TestUpstreamFieldOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted bool
		want    upstreamField
	}{
		{"X-Forwarded-For", false, fieldForwardedFor},
		{"x-forwarded-for", true, fieldForwardedFor},
		{"X_Forwarded_For", true, fieldDrop},
		{"x-forwarded_for", false, fieldDrop},
		{"Forwarded", false, fieldDrop},
		{"forwarded", true, fieldForward},
		{"X-Real-Ip", false, fieldDrop},
		{"X-Real-Ip", true, fieldForward},
		{"X_Real_Ip", true, fieldDrop},
		{"X-Request-Id", false, fieldRequestID},
		{"X_Request_Id", false, fieldDrop},
		{"X-Forwarded-Proto", true, fieldDrop},
		{"X_FORWARDED_HOST", true, fieldDrop},
		{"Http2-Settings", true, fieldDrop},
		{"Proxy_Authorization", true, fieldDrop},
		{"X-Forwarded-Fox", false, fieldForward},
		{"Accept", false, fieldForward},
	} {
		if got := upstreamFieldOf(tc.name, tc.trusted); got != tc.want {
			t.Errorf("upstreamFieldOf(%q, trusted %v) = %d, want %d", tc.name, tc.trusted, got, tc.want)
		}
	}
}

// take runs fields (name, value, ...) through a ForwardedFields reset
// for client and host, and returns the HTTP/1.1 field lines the
// upstream gets: the kept fields, then the proxy's own.
func take(f *ForwardedFields, client Client, host string, toHTTP2 bool, fields ...string) string {
	f.Reset(client, []byte(host), toHTTP2)
	var b []byte
	for i := 0; i+1 < len(fields); i += 2 {
		if f.Take([]byte(fields[i]), []byte(fields[i+1])) {
			b = append(b, fields[i]+": "+fields[i+1]+"\r\n"...)
		}
	}
	return string(f.AppendHTTP1(b))
}

func TestForwardedFields(t *testing.T) {
	var f ForwardedFields
	ip := []byte("10.0.0.1")
	got := take(&f, Client{IP: ip}, "a.example", false,
		"Accept", "*/*", "Connection", "x", "Keep-Alive", "1", "Host", "evil", "Content-Length", "5",
		"X-Forwarded-For", "1.2.3.4", "X-Forwarded-Proto", "https", "X-Request-Id", "abc-1", "TE", "trailers")
	want := "Accept: */*\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: a.example\r\nX-Request-Id: abc-1\r\n"
	if got != want {
		t.Errorf("untrusted, to HTTP/1.1:\n got %q\nwant %q", got, want)
	}

	got = take(&f, Client{IP: ip, TLS: true, TrustForwardedFor: true}, "", true,
		"X-Forwarded-For", "1.2.3.4", "X-Forwarded-For", "", "x-forwarded-for", "5.6.7.8", "te", "trailers")
	want = "X-Forwarded-For: 1.2.3.4, 5.6.7.8, 10.0.0.1\r\nX-Forwarded-Proto: https\r\n"
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "Te: trailers\r\n") || strings.Contains(got, "X-Forwarded-Host") {
		t.Errorf("trusted, to HTTP/2: got %q, want %q, a new X-Request-Id, Te: trailers and no X-Forwarded-Host", got, want)
	}

	// Two ids are one too many to choose from: a new one.
	got = take(&f, Client{IP: ip}, "", false, "X-Request-Id", "a", "X-Request-Id", "b")
	if i := strings.Index(got, "X-Request-Id: "); i < 0 || len(got)-i != len("X-Request-Id: ")+32+2 {
		t.Errorf("two client ids: %q, want a new 32-digit id", got)
	}
}

// The forwarding decisions cost no allocation once the X-Forwarded-For
// buffer has grown: they run on the HTTP/1.1 path, which allocates
// nothing per request.
func TestForwardedFieldsAllocatesNothing(t *testing.T) {
	var f ForwardedFields
	name, value := []byte("X-Forwarded-For"), []byte("192.0.2.1")
	accept, star := []byte("Accept"), []byte("*/*")
	client := Client{IP: []byte("10.0.0.1"), TrustForwardedFor: true}
	b := make([]byte, 0, 512)
	allocs := testing.AllocsPerRun(100, func() {
		f.Reset(client, nil, false)
		f.Take(accept, star)
		f.Take(name, value)
		b = f.AppendHTTP1(b[:0])
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request head, want 0", allocs)
	}
}
