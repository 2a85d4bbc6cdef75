package exchange

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hotproxy/hotproxy/http1"
)

// pieceSink feeds the read buffer from pieces, one per ReadUpstream (EOF
// after the last, or err), and records what is written and chunked.
type pieceSink struct {
	rb      *ReadBuffer
	pieces  [][]byte
	err     error // after the pieces; nil: io.EOF
	out     bytes.Buffer
	lasts   int // WriteBody calls that said last
	trailer []byte
	chunks  int
	done    bool
	flushes int
}

func (s *pieceSink) ReadUpstream() error {
	if len(s.pieces) == 0 {
		if s.err != nil {
			return s.err
		}
		return io.EOF
	}
	if s.rb.R == s.rb.W {
		s.rb.R, s.rb.W = 0, 0
	}
	s.rb.W += copy(s.rb.B[s.rb.W:], s.pieces[0])
	s.pieces = s.pieces[1:]
	return nil
}

func (s *pieceSink) WriteBody(p []byte, last bool) error {
	if last {
		s.lasts++
	}
	s.out.Write(p)
	return nil
}

func (s *pieceSink) Chunk(data, trailer []byte, done bool) error {
	s.out.Write(data)
	s.chunks++
	if done {
		s.done, s.trailer = true, append([]byte(nil), trailer...)
	}
	return nil
}

func (s *pieceSink) FlushChunks() error { s.flushes++; return nil }

func newSink(buffered string, pieces ...string) (*ReadBuffer, *pieceSink) {
	rb := &ReadBuffer{B: make([]byte, 64)}
	rb.W = copy(rb.B, buffered)
	s := &pieceSink{rb: rb}
	for _, p := range pieces {
		s.pieces = append(s.pieces, []byte(p))
	}
	return rb, s
}

func TestCopyLength(t *testing.T) {
	rb, s := newSink("hel", "lo, w", "orld", "NEXT RESPONSE")
	if err := CopyLength(rb, 12, s); err != nil {
		t.Fatal(err)
	}
	if got := s.out.String(); got != "hello, world" {
		t.Fatalf("copied %q, want %q", got, "hello, world")
	}
	if len(s.pieces) != 1 || rb.R != rb.W {
		t.Fatalf("read %d pieces too many, or left %q unconsumed", 1-len(s.pieces), rb.B[rb.R:rb.W])
	}
	if s.lasts != 1 {
		t.Fatalf("%d writes said last, want exactly the one that ends the body", s.lasts)
	}
	// The upstream ends early: its error, not a short body passed off
	// as whole.
	rb, s = newSink("abc")
	if err := CopyLength(rb, 10, s); err != io.EOF {
		t.Fatalf("short body: %v, want io.EOF", err)
	}
}

func TestCopyChunked(t *testing.T) {
	// Chunks split across reads, a chunk extension, a trailer.
	rb, s := newSink("5\r\nhel", "lo\r\n7;ext=1\r\n, world\r", "\n0\r\nGrpc-Status: 0\r\n\r\n")
	var d http1.ChunkedDecoder
	if err := CopyChunked(rb, &d, s); err != nil {
		t.Fatal(err)
	}
	if got := s.out.String(); got != "hello, world" || !s.done {
		t.Fatalf("copied %q (done %v), want %q and the last chunk", got, s.done, "hello, world")
	}
	if !bytes.Contains(s.trailer, []byte("Grpc-Status: 0")) {
		t.Fatalf("trailer %q, want the Grpc-Status field", s.trailer)
	}
	if s.flushes != 2 {
		t.Fatalf("%d flushes before refills, want 2", s.flushes)
	}
	for _, bad := range []string{"zz\r\nhello\r\n0\r\n\r\n", "5\r\nhelloXX0\r\n\r\n", "-1\r\n"} {
		rb, s = newSink(bad)
		err := CopyChunked(rb, &d, s)
		var he *http1.Error
		if !errors.As(err, &he) || he.Status != 502 {
			t.Errorf("malformed body %q: %v, want a 502 http1.Error", bad, err)
		}
	}
	// A body cut off before its last chunk: the read's error.
	rb, s = newSink("5\r\nhello\r\n")
	if err := CopyChunked(rb, &d, s); err != io.EOF || s.done {
		t.Fatalf("truncated body: %v (done %v), want io.EOF", err, s.done)
	}
}

func TestCopyUntilClose(t *testing.T) {
	rb, s := newSink("ab", "cd", "ef")
	if err := CopyUntilClose(rb, s); err != nil {
		t.Fatal(err)
	}
	if got := s.out.String(); got != "abcdef" {
		t.Fatalf("copied %q, want abcdef", got)
	}
	reset := errors.New("connection reset")
	rb, s = newSink("ab")
	s.err = reset
	if err := CopyUntilClose(rb, s); err != reset {
		t.Fatalf("a reset upstream: %v, want its error (EOF alone ends the body)", err)
	}
}
