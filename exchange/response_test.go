package exchange

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/http1"
)

// hooks records what ReadHTTP1Head and ReadMore asked of the front end.
type hooks struct {
	rb       *ReadBuffer
	grown    int
	interims []string
	failed   error
}

func (h *hooks) GrowReadBuffer() {
	nb := make([]byte, 64)
	h.rb.W = copy(nb, h.rb.B[h.rb.R:h.rb.W])
	h.rb.R = 0
	h.rb.B = nb
	h.grown++
}
func (h *hooks) InterimResponse(head []byte) error {
	h.interims = append(h.interims, string(head))
	return nil
}
func (h *hooks) ReadFailed(err error) error { h.failed = err; return err }

// trickle is an upstream that sends its bytes one at a time.
type trickle struct{ s string }

func (t *trickle) Read(p []byte) (int, error) {
	if t.s == "" {
		return 0, io.EOF
	}
	p[0] = t.s[0]
	t.s = t.s[1:]
	return 1, nil
}
func (t *trickle) SetReadDeadline(time.Time) error { return nil }

func readHead(t *testing.T, upstream string, small, max int) (*http1.Response, *hooks, *ReadBuffer, error) {
	t.Helper()
	rb := &ReadBuffer{B: make([]byte, small)}
	h := &hooks{rb: rb}
	var resp http1.Response
	err := ReadHTTP1Head(&trickle{upstream}, rb, &resp, []byte("GET"), max, h)
	return &resp, h, rb, err
}

// Interim responses go to the front end, one by one and whole, and the
// final head is parsed after them from a buffer grown once.
func TestReadHTTP1HeadInterims(t *testing.T) {
	const cont, hints = "HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
	resp, h, rb, err := readHead(t, cont+hints+"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 32, 64)
	if err != nil || resp.Status != 200 {
		t.Fatalf("status %d, %v; want 200", resp.Status, err)
	}
	if strings.Join(h.interims, "") != cont+hints {
		t.Errorf("interims %q, want the 100 and the 103", h.interims)
	}
	if h.grown != 1 || len(rb.B) != 64 {
		t.Errorf("buffer grown %d times to %d bytes, want once to 64", h.grown, len(rb.B))
	}
}

// A head larger than the largest buffer is a 502, never a read past it;
// an upstream that closes before a whole head fails through ReadFailed.
func TestReadHTTP1HeadBounds(t *testing.T) {
	_, _, _, err := readHead(t, "HTTP/1.1 200 OK\r\nX: "+strings.Repeat("a", 200)+"\r\n\r\n", 32, 64)
	var pe *http1.Error
	if !errors.As(err, &pe) || pe.Status != 502 {
		t.Errorf("oversized head: %v, want a 502", err)
	}
	_, h, _, err := readHead(t, "HTTP/1.1 200 OK\r\nContent-Le", 32, 64)
	if !errors.Is(err, io.EOF) || !errors.Is(h.failed, io.EOF) {
		t.Errorf("cut head: %v (ReadFailed saw %v), want EOF through ReadFailed", err, h.failed)
	}
	_, _, _, err = readHead(t, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 64, 64)
	if !errors.As(err, &pe) {
		t.Errorf("ambiguous framing: %v, want a parse error", err)
	}
}

// ReadMore swaps the head's small buffer at the first refill, compacts a
// full one, and says io.EOF when the upstream is done.
func TestReadMore(t *testing.T) {
	rb := &ReadBuffer{B: make([]byte, 8), R: 6, W: 8}
	copy(rb.B[6:], "ab")
	h := &hooks{rb: rb}
	up := &trickle{"c"}
	var deadline time.Time
	if err := ReadMore(up, rb, 64, h, &deadline, time.Minute); err != nil {
		t.Fatal(err)
	}
	if h.grown != 1 || string(rb.B[rb.R:rb.W]) != "abc" || deadline.IsZero() {
		t.Errorf("grown %d, unread %q, deadline %v; want 1, \"abc\", set", h.grown, rb.B[rb.R:rb.W], deadline)
	}
	rb.R = rb.W
	if err := ReadMore(up, rb, 64, h, &deadline, time.Minute); !errors.Is(err, io.EOF) || rb.R != 0 || rb.W != 0 {
		t.Errorf("at the end: %v, R %d W %d; want EOF in an emptied buffer", err, rb.R, rb.W)
	}
}

func TestPassesRepresentationLength(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		bodyless bool
		want     bool
	}{
		{"Content-Length", 200, true, true}, // HEAD
		{"content-length", 304, true, true},
		{"Content-Length", 204, true, false},
		{"Content-Length", 100, true, false},
		{"Content-Length", 200, false, false}, // framed by the proxy
		{"Transfer-Encoding", 200, true, false},
		{"Connection", 304, true, false},
	} {
		if got := PassesRepresentationLength([]byte(tc.name), tc.status, tc.bodyless); got != tc.want {
			t.Errorf("%s on a %d (bodyless %v): %v, want %v", tc.name, tc.status, tc.bodyless, got, tc.want)
		}
	}
}
