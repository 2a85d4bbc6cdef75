package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// rawExchange writes req on a fresh connection to addr, reads one response
// and then waits for the connection to end. It returns the response, and
// how the connection ended after the response head: nil for a clean close
// (EOF) after the whole body, else the error (a reset, or a timeout if it
// stayed open).
func rawExchange(t *testing.T, addr, req string) (*http.Response, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp, fmt.Errorf("reading the body: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, br)
	return resp, err
}

// TestBadInput sends what a proxy must refuse, and checks that it refuses
// it politely and keeps serving.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	cfg := httpProxyConfig(b.Addr)
	cfg.Listeners[0].MaxHeaderBytes = 4096
	p := harness.Start(t, cfg)
	addr := p.Addr("web")
	c := newClient(10 * time.Second)

	t.Run("malformed request line", func(t *testing.T) {
		resp, end := rawExchange(t, addr, "THIS IS NOT HTTP\r\n\r\n")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("got %s, want 400", resp.Status)
		}
		if end != nil {
			t.Errorf("connection after the 400: want a clean close (EOF), got %v", end)
		}
	})

	t.Run("malformed header", func(t *testing.T) {
		resp, end := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("got %s, want 400", resp.Status)
		}
		if end != nil {
			t.Errorf("connection after the 400: want a clean close (EOF), got %v", end)
		}
	})

	t.Run("oversized headers", func(t *testing.T) {
		req := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8192) + "\r\n\r\n"
		resp, end := rawExchange(t, addr, req)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("got %s, want 431", resp.Status)
		}
		// The proxy stops reading at the limit; it must half-close and
		// let the client finish, not close with the rest of the request
		// unread (which makes the kernel reset the connection, and the
		// client may lose the 431).
		if end != nil {
			t.Errorf("connection after the 431: want a clean close (EOF), got %v", end)
		}
	})

	t.Run("headers within the limit", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, p.URL("web", "/"), nil)
		req.Header.Set("X-Big", strings.Repeat("a", 2048))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("got %s, want 200", resp.Status)
		}
	})

	t.Run("upstream reset mid-response", func(t *testing.T) {
		resp, err := c.Get(p.URL("web", "/reset"))
		switch {
		case err != nil:
			t.Logf("client error before the response: %v", err)
		case resp.StatusCode != http.StatusOK:
			resp.Body.Close()
			t.Logf("proxy answered %s", resp.Status)
			if resp.StatusCode < 500 {
				t.Errorf("got %s, want an error, a 5xx or a truncated 200", resp.Status)
			}
		default:
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Errorf("200 with a complete body of %d bytes: the upstream's reset was hidden from the client (it promised 1 MiB)", n)
			} else {
				t.Logf("body truncated after %d bytes: %v", n, err)
			}
		}
		// The proxy keeps serving, on this client and on fresh ones.
		for i := 0; i < 3; i++ {
			resp, body := get(t, c, p.URL("web", "/"))
			if resp.StatusCode != http.StatusOK || body != "b1\n" {
				t.Fatalf("after the reset, request %d: %s %q", i, resp.Status, body)
			}
		}
		resp2, body := get(t, newClient(10*time.Second), p.URL("web", "/"))
		if resp2.StatusCode != http.StatusOK || body != "b1\n" {
			t.Fatalf("after the reset, fresh client: %s %q", resp2.Status, body)
		}
	})

	if p.Exited() {
		t.Fatalf("proxy exited:\n%s", p.Output())
	}
}
