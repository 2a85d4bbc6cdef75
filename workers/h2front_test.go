package workers

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestH2CInvalidPrefaceClosed: on an http2_cleartext listener, a client
// whose head is not the HTTP/2 preface and names no HTTP version is
// closed without an answer (h2spec 3.5/2: an HTTP/1.1 400 reads
// as garbage frames to an HTTP/2 client); an HTTP/1.1-only listener still
// answers it 400, and an h2c listener still answers HTTP/1.1 requests.
func TestH2CInvalidPrefaceClosed(t *testing.T) {
	const invalid = "INVALID CONNECTION PREFACE\r\n\r\n"
	cfg := directConfig("ok")
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 1)
	a := addr(t, m, "web")
	c, err := net.DialTimeout("tcp", a, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, invalid); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if len(got) != 0 || err != nil {
		t.Fatalf("h2c listener answered an invalid preface with %q (%v), want the connection closed and nothing sent", got, err)
	}
	if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("HTTP/1.1 request on the h2c listener: %d", resp.StatusCode)
	}
	// A malformed HTTP/1.1 request still gets its 400 there.
	if resp := rawRequest(t, a, "GET /a\nb HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 400 {
		t.Fatalf("malformed HTTP/1.1 request on the h2c listener: %d, want 400", resp.StatusCode)
	}

	m1 := startManager(t, directConfig("ok"), 1)
	if resp := rawRequest(t, addr(t, m1, "web"), invalid); resp.StatusCode != 400 && resp.StatusCode != 505 {
		t.Fatalf("HTTP/1.1-only listener: %d, want its 400", resp.StatusCode)
	}
}
