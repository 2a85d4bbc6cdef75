package workers

import (
	"bufio"
	"fmt"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// headOfLen is a GET head of exactly n bytes (n >= 64): its X-Pad field
// takes what the rest does not.
func headOfLen(tb testing.TB, path string, n int) string {
	tb.Helper()
	pre := "GET " + path + " HTTP/1.1\r\nHost: x\r\nX-Pad: "
	const post = "\r\n\r\n"
	pad := n - len(pre) - len(post)
	if pad < 1 {
		tb.Fatalf("headOfLen(%d): too short", n)
	}
	h := pre + strings.Repeat(string(rune('a'+len(path)%26)), pad) + post
	if len(h) != n {
		tb.Fatalf("headOfLen: %d bytes, want %d", len(h), n)
	}
	return h
}

// backendRequests parses what the backend received into its requests:
// path, X-Pad and body of each.
func backendRequests(tb testing.TB, got string) []string {
	tb.Helper()
	var out []string
	br := bufio.NewReader(strings.NewReader(got))
	for {
		req, err := http.ReadRequest(br)
		if err == io.EOF {
			return out
		}
		if err != nil {
			tb.Fatalf("the backend received something unparsable (%v):\n%q", err, got)
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			tb.Fatalf("request %s: body: %v", req.URL.Path, err)
		}
		out = append(out, fmt.Sprintf("%s pad=%s body=%s", req.URL.Path, req.Header.Get("X-Pad"), body))
	}
}

// clientRequests is what backendRequests says for the same requests as
// the client sent them.
func clientRequests(tb testing.TB, raw string) []string { return backendRequests(tb, raw) }

// Heads and bodies that straddle the small read buffer a request starts
// with, alone, pipelined and with a body in the same read: the backend
// receives each request whole and in order, exactly as the client sent it.
func TestHeadsAcrossTheSmallBuffer(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	a := addr(t, m, "web")
	body := strings.Repeat("0123456789", 1000) // 10,000 bytes: past the small buffer, in the head's read
	cases := []struct {
		name string
		raw  string
	}{
		{"head exactly the small buffer", headOfLen(t, "/at", httpfront.SmallBufSize)},
		{"head one byte over", headOfLen(t, "/over", httpfront.SmallBufSize+1)},
		{"head one byte under", headOfLen(t, "/under", httpfront.SmallBufSize-1)},
		{"head one byte over the large buffer", headOfLen(t, "/huge", httpfront.IOBufSize+1)},
		{"the second pipelined head crosses the boundary",
			headOfLen(t, "/p1", 1500) + headOfLen(t, "/p2", 1000) + headOfLen(t, "/p3", 100)},
		{"many pipelined, crossing it again and again",
			strings.Repeat(headOfLen(t, "/many", 700), 12) + headOfLen(t, "/last", httpfront.SmallBufSize+5)},
		{"a body behind its head in the same read",
			"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n" + body},
		{"a small body that ends exactly at the buffer's end",
			func() string {
				h := "POST /edge HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
				return headOfLen(t, "/before", httpfront.SmallBufSize-len(h)-100) + h + strings.Repeat("e", 100)
			}()},
		{"a chunked body with a trailer larger than the small buffer",
			"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"5\r\nhello\r\n0\r\nX-Trailer: " + strings.Repeat("t", 3000) + "\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, nBefore := cb.received()
			want := clientRequests(t, tc.raw)
			c, err := net.Dial("tcp", a)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			bodies := readResponses(t, bufio.NewReader(c), len(want))
			for i, b := range bodies {
				if b != "ok" {
					t.Fatalf("response %d: %q, want the backend's ok", i+1, b)
				}
			}
			got, n := cb.received()
			if n-nBefore != len(want) {
				t.Fatalf("the backend answered %d requests, want %d", n-nBefore, len(want))
			}
			gotReqs := backendRequests(t, got[len(before):])
			if strings.Join(gotReqs, "\n") != strings.Join(want, "\n") {
				t.Fatalf("the backend received:\n%.300s\nwant:\n%.300s", strings.Join(gotReqs, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// Response heads and bodies that straddle the small upstream read buffer
// reach the client whole.
func TestResponsesAcrossTheSmallBuffer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		headFields int // bytes of an X-Pad field
		body       int
	}{
		{"small", 10, 100},
		{"head over the small buffer", 3000, 100},
		{"body over the small buffer", 10, 100_000},
		{"head ending at the small buffer's end", httpfront.SmallBufSize - 80, 0},
		{"both", 20_000, 300_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pad := strings.Repeat("p", tc.headFields)
			body := strings.Repeat("0123456789abcdef", tc.body/16+1)[:tc.body]
			resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Pad: %s\r\nContent-Length: %d\r\n\r\n%s", pad, len(body), body)
			cb := newCaptureBackend(t, resp)
			m := startManager(t, proxyConfig(cb.addr), 1)
			c, err := net.Dial("tcp", addr(t, m, "web"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			for i := range 3 { // the same connection: buffers taken and given back each time
				if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				r, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("response %d: %v", i+1, err)
				}
				got, err := io.ReadAll(r.Body)
				if err != nil || string(got) != body || r.Header.Get("X-Pad") != pad {
					t.Fatalf("response %d: body %d bytes (want %d), X-Pad %d bytes (want %d), err %v",
						i+1, len(got), len(body), len(r.Header.Get("X-Pad")), len(pad), err)
				}
			}
		})
	}
}

// A connection's BufferBytes says what it holds: nothing once every
// request is done, and the workers' count falls back to nothing too.
func TestBuffersGivenBackAfterEachRequest(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	raw := headOfLen(t, "/a", 5000) + "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\n" + strings.Repeat("b", 50000)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	readResponses(t, bufio.NewReader(c), 2)
	waitFor(t, 5*time.Second, "the connection to be idle holding nothing", func() bool {
		return idleConns(m) == 1 && m.workers[0].front.Bufs.Held() == 0
	})
	m.workers[0].conns.mu.Lock()
	defer m.workers[0].conns.mu.Unlock()
	for conn := range m.workers[0].conns.m {
		if cc, ok := conn.(*httpfront.Conn); ok && cc.BufferBytes() != 0 {
			t.Fatalf("an idle connection holds %d bytes", cc.BufferBytes())
		}
	}
}

// A connection that ends with bytes still buffered (here: a refused
// request with more behind it) gives its buffers back too, so that what
// the workers count as held, which the reclaimer watches, returns to zero.
func TestBuffersGivenBackWhenAConnectionEndsMidBuffer(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	bad := "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
	resp, _ := exchangeRaw(t, addr(t, m, "web"), bad+headOfLen(t, "/behind", 1500))
	if !strings.HasPrefix(resp, "HTTP/1.1 400 ") {
		t.Fatalf("CL+TE: %q, want 400", firstLine(resp))
	}
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /cut HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("c", 3000))
	readResponses(t, bufio.NewReader(c), 1)
	c.Close() // the second head never ends
	waitFor(t, 5*time.Second, "every connection to end holding nothing", func() bool {
		return m.workers[0].conns.len() == 0 && m.workers[0].front.Bufs.Held() == 0
	})
}

// Random pipelines of heads and bodies around the small buffer's size,
// written in random pieces: the backend receives exactly what was sent,
// request by request (the attacker's view of the buffer's boundary).
func TestRandomPipelinesAcrossTheSmallBuffer(t *testing.T) {
	cb := newCaptureBackend(t, okResponse)
	m := startManager(t, proxyConfig(cb.addr), 1)
	a := addr(t, m, "web")
	rng := rand.New(rand.NewPCG(22, 2))
	for iter := range 40 {
		var raw strings.Builder
		n := 1 + rng.IntN(6)
		for i := range n {
			path := fmt.Sprintf("/r%d-%d", iter, i)
			size := httpfront.SmallBufSize - 300 + rng.IntN(600)
			if rng.IntN(4) == 0 {
				size = 64 + rng.IntN(httpfront.SmallBufSize*3)
			}
			if rng.IntN(3) == 0 {
				body := strings.Repeat("b", rng.IntN(3*httpfront.SmallBufSize))
				h := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nX-Pad: %s\r\n\r\n", path, len(body), strings.Repeat("q", rng.IntN(httpfront.SmallBufSize)))
				raw.WriteString(h + body)
				continue
			}
			raw.WriteString(headOfLen(t, path, max(size, 64)))
		}
		want := clientRequests(t, raw.String())
		before, nBefore := cb.received()
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var pieces []string // random pieces, cut here: rng is not the writer's
		for s := raw.String(); len(s) > 0; {
			k := min(len(s), 1+rng.IntN(3*httpfront.SmallBufSize))
			pieces, s = append(pieces, s[:k]), s[k:]
		}
		go func() { // while the responses are read
			for _, p := range pieces {
				if _, err := io.WriteString(c, p); err != nil {
					return
				}
			}
		}()
		readResponses(t, bufio.NewReader(c), len(want))
		c.Close()
		got, nGot := cb.received()
		if nGot-nBefore != len(want) {
			t.Fatalf("iteration %d: the backend answered %d requests, want %d", iter, nGot-nBefore, len(want))
		}
		if g := backendRequests(t, got[len(before):]); strings.Join(g, "\n") != strings.Join(want, "\n") {
			t.Fatalf("iteration %d: the backend received:\n%.400s\nwant:\n%.400s", iter, strings.Join(g, "\n"), strings.Join(want, "\n"))
		}
	}
}
