package workers

import (
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"golang.org/x/net/http2"
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

// TestH2CBufferedBodyRetried: an HTTP/2 request whose whole body the
// engine buffered before the handler ran can be sent again, so it is
// retried on a 5xx like a request without a body (x/net's server handed
// every body over as a stream: such a request was tried once).
func TestH2CBufferedBodyRetried(t *testing.T) {
	var bad, good atomic.Int64
	cfg := retryConfig(func(r *config.Route) { r.RetryOn, r.NumRetries = []string{"5xx"}, new(1) },
		namedBackend(t, "bad", 503, &bad), namedBackend(t, "good", 200, &good))
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 1)
	c := h2cClient(t)
	for i := range 10 {
		resp, body := h2Do(t, c, newReq(t, "PUT", "http://"+addr(t, m, "web")+"/", strings.NewReader("a small body")))
		if resp.StatusCode != 200 || body != "good" {
			t.Fatalf("request %d: %d %q, want the good endpoint's 200 (retried)", i, resp.StatusCode, body)
		}
	}
	if bad.Load() == 0 {
		t.Fatal("the failing endpoint got no request: the test proves nothing")
	}
	if n := counter(m, "cluster.backend.upstream_rq_retry"); n != uint64(bad.Load()) {
		t.Errorf("upstream_rq_retry = %d, want %d (one per 503)", n, bad.Load())
	}
}

// TestH2CLengthBodyEndsInItsLastDataFrame: a response of known length
// proxied from HTTP/1.1 ends in the DATA frame that carries its last
// bytes, not in an empty DATA frame after it (a frame, and its encoding,
// less per response).
func TestH2CLengthBodyEndsInItsLastDataFrame(t *testing.T) {
	be := newCountingBackend(t, 100)
	m := startManager(t, proxyConfig(be.addr, h2cListener), 1)
	a := addr(t, m, "web")
	rc := dialRawH2(t, a)
	for stream := uint32(1); stream <= 5; stream += 2 {
		rc.get(t, stream, a, "/")
		var dataFrames, bodyBytes int
		for ended := false; !ended; {
			f, err := rc.fr.ReadFrame()
			if err != nil {
				t.Fatalf("stream %d: %v", stream, err)
			}
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if f.StreamID == stream && f.PseudoValue("status") != "200" {
					t.Fatalf("stream %d: status %q, want 200", stream, f.PseudoValue("status"))
				}
				ended = f.StreamID == stream && f.StreamEnded()
			case *http2.DataFrame:
				if f.StreamID != stream {
					continue
				}
				dataFrames++
				bodyBytes += len(f.Data())
				ended = f.StreamEnded()
			case *http2.RSTStreamFrame:
				t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
			case *http2.SettingsFrame:
				if !f.IsAck() {
					rc.fr.WriteSettingsAck()
				}
			}
		}
		if bodyBytes != 100 || dataFrames != 1 {
			t.Errorf("stream %d: %d body bytes in %d DATA frames, want 100 in 1 (END_STREAM on the frame with the last bytes)", stream, bodyBytes, dataFrames)
		}
	}
}
