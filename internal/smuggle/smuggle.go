// Package smuggle is a request-smuggling check for any HTTP/1.1 proxy: the
// framing cases a proxy and a backend could disagree on (RFC 9112 §6.3),
// sent over raw sockets to a proxy in front of a raw capture backend, with
// what the proxy answered and what reached the backend; and HTTP/2
// requests whose pseudo-headers a proxy could turn into another HTTP/1.1
// request line (h2.go), sent with a raw framer. The workers tests
// hold hotproxy to it; scripts/smuggle-check.sh runs it against hotproxy,
// nginx and HAProxy alike.
package smuggle

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Marker is the path of the request hidden in each case's bytes: it must
// never reach the backend as a request of its own (nor, in a trailer
// case, as a forged field's value).
const Marker = "/smuggled-request"

const smuggled = "GET " + Marker + " HTTP/1.1\r\nHost: x\r\n\r\n"

// Case is one attempt.
type Case struct {
	Name string
	// Raw is sent as it is on a fresh connection; Then, if set, after
	// the backend has seen Wait (a request cut in two: the upstream is
	// chosen before the bad bytes arrive).
	Raw, Wait, Then string
	// Status is what a strict proxy answers ("400", "414", "431", "505";
	// "200" for a request whose trailer it filters).
	Status string
	// HeadOnly: nothing at all may reach the backend (the head itself is
	// bad); otherwise only the hidden request must not.
	HeadOnly bool
}

// Cases are the framing cases of hotproxy's issue 8 (items 1–4) and
// issue 10: Content-Length and Transfer-Encoding together, every
// Transfer-Encoding but a single final chunked, bad Content-Length
// values, obs-fold, bare CR and LF, whitespace before a colon, control
// bytes, Host confusion, bad chunk sizes, limits; and issue 21's
// forwarding fields hidden in a request trailer.
func Cases() []Case {
	te := "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	return []Case{
		{Name: "CL and TE", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "TE and CL", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "TE chunked, identity", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "TE xchunked", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "TE twice", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "TE in HTTP/1.0", Raw: "POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "space before colon", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, Status: "400", HeadOnly: true},
		{Name: "differing CL", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab" + smuggled, Status: "400", HeadOnly: true},
		{Name: "CL list", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\nab" + smuggled, Status: "400", HeadOnly: true},
		{Name: "CL with sign", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\nab" + smuggled, Status: "400", HeadOnly: true},
		{Name: "CL overflow", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\nab" + smuggled, Status: "400", HeadOnly: true},
		{Name: "obs-fold", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "bare LF", Raw: "GET / HTTP/1.1\nHost: x\n\n", Status: "400", HeadOnly: true},
		{Name: "bare CR", Raw: "GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "NUL in value", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "two Host", Raw: "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "no Host in 1.1", Raw: "GET / HTTP/1.1\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "Host vs absolute target", Raw: "GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n", Status: "400", HeadOnly: true},
		{Name: "chunk size junk", Raw: te + "5g\r\nhello\r\n0\r\n\r\n" + smuggled, Status: "400"},
		{Name: "chunk size negative", Raw: te + "-5\r\nhello\r\n0\r\n\r\n" + smuggled, Status: "400"},
		{Name: "chunk size overflow", Raw: te + "ffffffffffffffffff1\r\nhello\r\n0\r\n\r\n" + smuggled, Status: "400"},
		{Name: "chunk size 0x", Raw: te + "0x5\r\nhello\r\n0\r\n\r\n" + smuggled, Status: "400"},
		{Name: "chunk without CRLF", Raw: te + "5\r\nhelloXX0\r\n\r\n" + smuggled, Status: "400"},
		{Name: "bad chunk after the upstream was chosen", Raw: te + "5\r\nhello\r\n", Wait: "hello", Then: "5g\r\n" + smuggled, Status: "400"},
		{Name: "request line too long", Raw: "GET /" + strings.Repeat("a", 9000) + " HTTP/1.1\r\nHost: x\r\n\r\n", Status: "414", HeadOnly: true},
		{Name: "head too large", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 100<<10) + "\r\n\r\n", Status: "431", HeadOnly: true},
		{Name: "HTTP/2.0 request line", Raw: "GET / HTTP/2.0\r\nHost: x\r\n\r\n", Status: "505", HeadOnly: true},
		// Issue 21: a forwarding field or credential in the trailer,
		// after the body, where a backend that merges trailers into the
		// header section would trust it. The request itself is fine
		// (200); the field, Marker as its value, must not reach the
		// backend.
		{Name: "X-Forwarded-For in trailer", Raw: teClose + "5\r\nhello\r\n0\r\nX-Forwarded-For: " + Marker + "\r\n\r\n", Status: "200"},
		{Name: "X_Forwarded_For in trailer", Raw: teClose + "5\r\nhello\r\n0\r\nX_Forwarded_For: " + Marker + "\r\n\r\n", Status: "200"},
		{Name: "X-Request-Id in trailer", Raw: teClose + "5\r\nhello\r\n0\r\nX-Request-Id: " + Marker + "\r\n\r\n", Status: "200"},
		{Name: "Forwarded in trailer", Raw: teClose + "5\r\nhello\r\n0\r\nForwarded: for=\"" + Marker + "\"\r\n\r\n", Status: "200"},
		{Name: "Proxy-Authorization in trailer", Raw: teClose + "5\r\nhello\r\n0\r\nProxy-Authorization: " + Marker + "\r\n\r\n", Status: "200"},
	}
}

// teClose is a chunked request head whose connection closes after it.
const teClose = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"

// Result is what one case did.
type Result struct {
	Case
	Answer    string // the proxy's first status line
	Responses int    // status lines the proxy sent on the connection
	Closed    bool   // the proxy closed the connection
	Reached   string // what the backend received on the case's connection(s)
}

// Smuggled reports whether the hidden request reached the backend.
func (r Result) Smuggled() bool { return strings.Contains(r.Reached, Marker) }

// Strict reports whether the proxy did what hotproxy holds itself to:
// the expected status, one response, the connection closed, the hidden
// request never forwarded, and for a bad head nothing forwarded at all.
func (r Result) Strict() bool {
	return strings.HasPrefix(r.Answer, "HTTP/1.1 "+r.Status+" ") && r.Responses == 1 && r.Closed &&
		!r.Smuggled() && (!r.HeadOnly || r.Reached == "")
}

// Safe reports the weaker property that matters against smuggling: the
// hidden request never reached the backend.
func (r Result) Safe() bool { return !r.Smuggled() }

// Backend is a raw HTTP/1.1 capture backend: it records every byte it
// receives and answers each request with 200 "ok".
type Backend struct {
	ln   net.Listener
	mu   sync.Mutex // guards got
	got  bytes.Buffer
	done chan struct{}
}

// Listen starts a capture backend on addr ("127.0.0.1:0" for any port).
func Listen(addr string) (*Backend, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &Backend{ln: ln, done: make(chan struct{})}
	go b.serve()
	return b, nil
}

// Addr is the backend's address.
func (b *Backend) Addr() string { return b.ln.Addr().String() }

// Close stops the backend.
func (b *Backend) Close() error {
	err := b.ln.Close()
	<-b.done
	return err
}

func (b *Backend) serve() {
	defer close(b.done)
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(io.TeeReader(c, recorder{b}))
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
					return
				}
			}
		}()
	}
}

type recorder struct{ b *Backend }

func (r recorder) Write(p []byte) (int, error) {
	r.b.mu.Lock()
	r.b.got.Write(p)
	r.b.mu.Unlock()
	return len(p), nil
}

// received is everything the backend has received so far.
func (b *Backend) received() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.got.String()
}

// Run sends c to the proxy at proxyAddr, in front of b, and reports what
// happened. Only one case may run at a time against one backend.
func Run(proxyAddr string, b *Backend, c Case) (Result, error) {
	r := Result{Case: c}
	before := len(b.received())
	conn, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, c.Raw); err != nil {
		return r, err
	}
	if c.Then != "" {
		// A proxy that buffers whole request bodies (nginx does) never
		// forwards the first part alone: after a second, the rest goes
		// anyway.
		deadline := time.Now().Add(time.Second)
		for !strings.Contains(b.received()[before:], c.Wait) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		io.WriteString(conn, c.Then)
	}
	out, err := io.ReadAll(conn)
	r.Closed = err == nil
	resp := string(out)
	r.Answer, _, _ = strings.Cut(resp, "\r\n")
	r.Responses = strings.Count("\n"+resp, "\nHTTP/1.")
	// Let whatever the proxy forwards settle before reading the backend.
	time.Sleep(50 * time.Millisecond)
	r.Reached = b.received()[before:]
	return r, nil
}
