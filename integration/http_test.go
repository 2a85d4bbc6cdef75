package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// bigBody is the size of the large bodies streamed through the proxy.
const bigBody = 16 << 20

// TestHTTPByteExact streams large bodies both ways through an http listener
// and compares their sha256: a response with and without Content-Length, a
// request with Content-Length and a chunked one.
func TestHTTPByteExact(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	c := newClient(60 * time.Second)
	want := harness.PatternSHA256(bigBody)

	for _, tc := range []struct{ name, query string }{
		{"GET chunked response", ""},
		{"GET content-length response", "&cl=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.Get(p.URL("web", fmt.Sprintf("/bytes?n=%d%s", bigBody, tc.query)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %s", resp.Status)
			}
			if tc.query != "" && resp.ContentLength != bigBody {
				t.Errorf("Content-Length: got %d, want %d", resp.ContentLength, bigBody)
			}
			if err := harness.CheckPattern(resp.Body, bigBody); err != nil {
				t.Fatal(err)
			}
		})
	}

	for _, tc := range []struct {
		name    string
		chunked bool
	}{
		{"POST content-length request", false},
		{"POST chunked request", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL("web", "/echo"), harness.PatternReader(bigBody))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.chunked {
				req.ContentLength = bigBody
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %s", resp.Status)
			}
			if err := harness.CheckPattern(resp.Body, bigBody); err != nil {
				seen, _ := b.LastSeen()
				t.Fatalf("echo: %v (backend saw Content-Length %d, Transfer-Encoding %v)", err, seen.ContentLength, seen.TransferEncoding)
			}
			seen, _ := b.LastSeen()
			if tc.chunked {
				// The proxy may forward a chunked body as it came or with
				// a length; either way the backend got every byte (the
				// echo above), and never a wrong length.
				if seen.ContentLength != -1 && seen.ContentLength != bigBody {
					t.Errorf("backend saw Content-Length %d for a chunked body of %d", seen.ContentLength, bigBody)
				}
			} else if seen.ContentLength != bigBody {
				t.Errorf("backend saw Content-Length %d, want %d", seen.ContentLength, bigBody)
			}
			// The backend's hash of what it received travels in a
			// trailer; a proxy that drops trailers is not wrong here.
			if got := resp.Trailer.Get(harness.HeaderBodySHA256); got != "" && got != want {
				t.Errorf("backend received a body with sha256 %s, want %s", got, want)
			}
		})
	}

	t.Run("keep-alive reuse after large bodies", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			resp, body := get(t, c, p.URL("web", "/"))
			if resp.StatusCode != http.StatusOK || body != "b1\n" {
				t.Fatalf("request %d: %s %q", i, resp.Status, body)
			}
		}
	})

	t.Run("forwarding headers", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, p.URL("web", "/headers"), nil)
		req.Header.Set("X-Request-Id", "req-42")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		seen, ok := b.LastSeen()
		if !ok || seen.Path != "/headers" {
			t.Fatalf("backend did not see /headers: %+v", seen)
		}
		// What the proxy adds is its own business; report it, and
		// insist only that a client's request id is not lost.
		t.Logf("backend saw X-Forwarded-For=%q X-Forwarded-Proto=%q X-Request-Id=%q Host=%q",
			seen.XForwardedFor, seen.XForwardedProto, seen.XRequestID, seen.Host)
		if seen.XRequestID != "req-42" {
			t.Errorf("X-Request-Id: backend saw %q, want the client's %q", seen.XRequestID, "req-42")
		}
	})
}
