package harness

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Headers the HTTP backend sets on every response.
const (
	// HeaderBackendID carries the backend's id.
	HeaderBackendID = "X-Backend-Id"
	// HeaderBodySHA256 carries the hex sha256 of the request body the
	// backend received (on /echo and any request with a body).
	HeaderBodySHA256 = "X-Request-Body-Sha256"
)

// maxSeen bounds the request records an HTTPBackend keeps.
const maxSeen = 4096

// Seen is what an HTTPBackend recorded of one request.
type Seen struct {
	Method, Path, Host string
	RemoteAddr         string
	XForwardedFor      string
	XForwardedProto    string
	XRequestID         string
	Connection         string
	ContentLength      int64
	TransferEncoding   []string
}

// HTTPBackend is an HTTP/1.1 server on a free loopback port. Endpoints:
//
//	/            200, body "<id>\n"
//	/echo        200, the request body echoed byte-exact (any request with
//	             a body is echoed, whatever its path)
//	/bytes?n=N   200, N bytes of Pattern streamed in chunks (chunked
//	             encoding; add &cl=1 for a Content-Length)
//	/slow?ms=M   200 after M milliseconds, body "<id>\n"; with &max=X, after
//	             a random delay between M and X milliseconds
//	/drip?n=N&ms=M  200, N bytes of Pattern streamed in 20 pieces spread
//	             over M milliseconds, each flushed (a long response)
//	/status?code=C  status C, body "<id>\n"
//	/reset       headers and part of a body, then the connection is reset
//	             (SO_LINGER 0)
//
// Every response carries X-Backend-Id: <id>.
type HTTPBackend struct {
	ID   string
	Addr string // "127.0.0.1:PORT"

	srv      *http.Server
	requests atomic.Int64

	mu   sync.Mutex // guards seen
	seen []Seen
}

// StartHTTPBackend starts an HTTPBackend that answers as id; it is closed
// when the test ends.
func StartHTTPBackend(tb testing.TB, id string) *HTTPBackend {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("http backend %q: %v", id, err)
	}
	b := &HTTPBackend{ID: id, Addr: ln.Addr().String()}
	b.srv = &http.Server{
		Handler:           b,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go b.srv.Serve(ln)
	tb.Cleanup(func() { b.srv.Close() })
	return b
}

// Requests returns how many requests the backend has received.
func (b *HTTPBackend) Requests() int64 { return b.requests.Load() }

// Seen returns the recorded requests (at most the last few thousand).
func (b *HTTPBackend) Seen() []Seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Seen(nil), b.seen...)
}

// LastSeen returns the most recent request record and whether there is one.
func (b *HTTPBackend) LastSeen() (Seen, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) == 0 {
		return Seen{}, false
	}
	return b.seen[len(b.seen)-1], true
}

// ServeHTTP implements http.Handler.
func (b *HTTPBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.requests.Add(1)
	b.record(r)
	w.Header().Set(HeaderBackendID, b.ID)
	q := r.URL.Query()
	switch r.URL.Path {
	case "/reset":
		b.reset(w)
		return
	case "/bytes":
		n, err := strconv.ParseInt(q.Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		if q.Get("cl") == "1" {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		WritePattern(w, n)
		return
	case "/drip":
		n, err := strconv.ParseInt(q.Get("n"), 10, 64)
		ms, _ := strconv.Atoi(q.Get("ms"))
		if err != nil || n < 0 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		drip(r.Context(), w, n, time.Duration(ms)*time.Millisecond)
		return
	case "/slow":
		ms, _ := strconv.Atoi(q.Get("ms"))
		if most, err := strconv.Atoi(q.Get("max")); err == nil && most > ms {
			ms += rand.IntN(most - ms + 1)
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s\n", b.ID)
		return
	case "/status":
		code, err := strconv.Atoi(q.Get("code"))
		if err != nil || code < 100 || code > 999 {
			code = http.StatusBadRequest
		}
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(code)
		fmt.Fprintf(w, "%s\n", b.ID)
		return
	}
	if r.URL.Path == "/echo" || r.ContentLength != 0 {
		b.echo(w, r)
		return
	}
	fmt.Fprintf(w, "%s\n", b.ID)
}

func (b *HTTPBackend) record(r *http.Request) {
	s := Seen{
		Method:           r.Method,
		Path:             r.URL.RequestURI(),
		Host:             r.Host,
		RemoteAddr:       r.RemoteAddr,
		XForwardedFor:    r.Header.Get("X-Forwarded-For"),
		XForwardedProto:  r.Header.Get("X-Forwarded-Proto"),
		XRequestID:       r.Header.Get("X-Request-Id"),
		Connection:       r.Header.Get("Connection"),
		ContentLength:    r.ContentLength,
		TransferEncoding: r.TransferEncoding,
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) >= maxSeen {
		b.seen = append(b.seen[:0], b.seen[len(b.seen)/2:]...)
	}
	b.seen = append(b.seen, s)
}

// echo streams the request body back. The hash of what was received is
// announced in a trailer, since it is only known at the end.
func (b *HTTPBackend) echo(w http.ResponseWriter, r *http.Request) {
	// Reading the request while writing the response: HTTP/1 needs this
	// to be asked for.
	http.NewResponseController(w).EnableFullDuplex()
	w.Header().Set("Trailer", HeaderBodySHA256)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			// A broken request: break the response too, rather than
			// end it cleanly and short.
			panic(http.ErrAbortHandler)
		}
	}
	w.Header().Set(HeaderBodySHA256, hex.EncodeToString(h.Sum(nil)))
}

// reset writes a response head that promises a large body, a little of it,
// and then resets the connection.
func (b *HTTPBackend) reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	conn, bufrw, err := hj.Hijack()
	if err != nil {
		return
	}
	fmt.Fprintf(bufrw, "HTTP/1.1 200 OK\r\n%s: %s\r\nContent-Length: 1048576\r\nContent-Type: application/octet-stream\r\n\r\n", HeaderBackendID, b.ID)
	WritePattern(bufrw, 4096)
	bufrw.Flush()
	// Give the proxy a moment to forward the head and the first bytes, so
	// that the reset lands mid-response rather than before it.
	time.Sleep(50 * time.Millisecond)
	ResetConn(conn)
}

// ResetConn closes c with SO_LINGER 0, so the peer gets a RST, not a FIN.
func ResetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Pattern is the deterministic byte stream /bytes serves: byte i is
// Pattern(i). It is not periodic at any power of two, so a dropped or
// duplicated buffer changes the hash.
func Pattern(i int64) byte { return byte((i*7 + i/251) % 253) }

// WritePattern writes the first n bytes of the pattern to w in 32 KiB
// writes, flushing after each if w is an http.Flusher.
func WritePattern(w io.Writer, n int64) error {
	buf := make([]byte, 32<<10)
	var off int64
	f, _ := w.(http.Flusher)
	for off < n {
		k := int64(len(buf))
		if n-off < k {
			k = n - off
		}
		for i := int64(0); i < k; i++ {
			buf[i] = Pattern(off + i)
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		if f != nil {
			f.Flush()
		}
		off += k
	}
	return nil
}

// drip writes the first n bytes of the pattern to w in dripPieces pieces,
// one every over/dripPieces, each flushed, until done or ctx ends.
func drip(ctx context.Context, w http.ResponseWriter, n int64, over time.Duration) {
	f, _ := w.(http.Flusher)
	every := over / dripPieces
	var off int64
	for i := int64(1); i <= dripPieces; i++ {
		end := n * i / dripPieces
		buf := make([]byte, end-off)
		for j := range buf {
			buf[j] = Pattern(off + int64(j))
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		if f != nil {
			f.Flush()
		}
		off = end
		if i == dripPieces {
			return
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return
		}
	}
}

// dripPieces is how many pieces /drip sends its body in.
const dripPieces = 20

// PatternReader returns a reader of the first n bytes of the pattern.
func PatternReader(n int64) io.Reader {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WritePattern(pw, n)) }()
	return pr
}

var patternSums sync.Map // int64 -> string

// PatternSHA256 returns the hex sha256 of the first n bytes of the pattern.
// Results are cached: large patterns are hashed once per test process.
func PatternSHA256(n int64) string {
	if s, ok := patternSums.Load(n); ok {
		return s.(string)
	}
	h := sha256.New()
	WritePattern(h, n)
	s := hex.EncodeToString(h.Sum(nil))
	patternSums.Store(n, s)
	return s
}

// SHA256Reader reads r to EOF and returns its length and hex sha256.
func SHA256Reader(r io.Reader) (int64, string, error) {
	h := sha256.New()
	n, err := io.Copy(h, bufio.NewReaderSize(r, 64<<10))
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// TCPEchoBackend echoes every connection: it reads until the client's EOF,
// writing back everything as it comes, and then half-closes its side
// (CloseWrite) so the client reads the whole echo followed by EOF.
type TCPEchoBackend struct {
	Addr string

	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

// StartTCPEchoBackend starts a TCPEchoBackend on a free loopback port; it and
// its connections are closed when the test ends.
func StartTCPEchoBackend(tb testing.TB) *TCPEchoBackend {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("tcp echo backend: %v", err)
	}
	b := &TCPEchoBackend{Addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	tb.Cleanup(b.close)
	return b
}

// Accepted returns how many connections the backend has accepted.
func (b *TCPEchoBackend) Accepted() int64 { return b.accepted.Load() }

func (b *TCPEchoBackend) serve() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.accepted.Add(1)
		b.mu.Lock()
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer func() {
				b.mu.Lock()
				delete(b.conns, c)
				b.mu.Unlock()
				c.Close()
			}()
			if _, err := io.Copy(c, c); err != nil {
				return
			}
			c.(*net.TCPConn).CloseWrite()
			// Wait for the peer to close, bounded, so the FIN is not
			// followed by a RST for unread data.
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, c)
		}()
	}
}

func (b *TCPEchoBackend) close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// CheckPattern reads r to EOF and checks that it is exactly the first n
// bytes of the pattern. The error says where it first differs, so a hole in
// the middle of a stream is told from a short tail.
func CheckPattern(r io.Reader, n int64) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var off int64
	mismatch := int64(-1)
	buf := make([]byte, 32<<10)
	for {
		k, err := br.Read(buf)
		for i := 0; i < k; i++ {
			if mismatch < 0 && (off+int64(i) >= n || buf[i] != Pattern(off+int64(i))) {
				mismatch = off + int64(i)
			}
		}
		off += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, n, err)
		}
	}
	switch {
	case mismatch >= 0:
		return fmt.Errorf("got %d bytes, want %d: first difference at offset %d", off, n, mismatch)
	case off != n:
		return fmt.Errorf("got %d bytes, want %d: the stream ended early, the bytes it had were right", off, n)
	}
	return nil
}
