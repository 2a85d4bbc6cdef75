package http1

import "errors"

// MaxHeaders is the most field lines a head may carry; more is 431 for a
// request and an error for a response. Requests carry their fields in a
// fixed array of this size so that parsing never allocates.
const MaxHeaders = 100

// Defaults for Limits; a zero field in Limits takes these.
const (
	DefaultMaxRequestLine = 8192
	DefaultMaxHeadBytes   = 64 << 10
)

// Limits bound what a parser accepts; zero fields take the defaults.
type Limits struct {
	MaxRequestLine int // default DefaultMaxRequestLine = 8192; longer → 414
	MaxHeadBytes   int // the whole head including the request/status line and final CRLF; default DefaultMaxHeadBytes = 64<<10; larger → 431
}

func (l Limits) withDefaults() Limits {
	if l.MaxRequestLine <= 0 {
		l.MaxRequestLine = DefaultMaxRequestLine
	}
	if l.MaxHeadBytes <= 0 {
		l.MaxHeadBytes = DefaultMaxHeadBytes
	}
	// Spans are int32: no head may reach past what they can index.
	l.MaxHeadBytes = min(l.MaxHeadBytes, 1<<31-1)
	l.MaxRequestLine = min(l.MaxRequestLine, 1<<31-3)
	return l
}

// Span is buf[Start:End] of the buffer a head was parsed from. It is only
// meaningful for that buffer, and only until the buffer is refilled.
type Span struct{ Start, End int32 }

// Bytes returns the bytes the span covers in buf (the buffer the head was
// parsed from).
func (s Span) Bytes(buf []byte) []byte { return buf[s.Start:s.End:s.End] }

// Len is the length of the span in bytes.
func (s Span) Len() int { return int(s.End - s.Start) }

// Field is one header field line. Value has surrounding OWS trimmed.
// Hop marks a field a proxy must not forward: Connection, Keep-Alive,
// Proxy-Connection, TE, Trailer, Upgrade, Transfer-Encoding, Content-Length
// (the forwarder writes its own framing header), and every field named in a
// Connection header.
type Field struct {
	Name, Value Span
	Hop         bool
}

// Framing says how the body of a message is delimited (RFC 9112 §6.3).
type Framing uint8

const (
	FramingNone       Framing = iota // no body
	FramingLength                    // ContentLength bytes
	FramingChunked                   // chunked transfer coding
	FramingUntilClose                // responses only: the body ends when the connection does
)

func (f Framing) String() string {
	switch f {
	case FramingNone:
		return "none"
	case FramingLength:
		return "length"
	case FramingChunked:
		return "chunked"
	case FramingUntilClose:
		return "until-close"
	}
	return "invalid"
}

// Error is a message that must not be processed. Status is what a server
// answers (400, 414, 431, 501, 505) for a request; 502 for a response.
//
// Every *Error the package returns is a package-level value, so returning
// one never allocates; callers must not modify it.
type Error struct {
	Status int
	Reason string // short, for logs and the error body: "obs-fold in header field"
}

func (e *Error) Error() string { return "http1: " + e.Reason }

// ErrIncomplete: buf does not hold a whole head yet (and no limit is exceeded): read more.
var ErrIncomplete = errors.New("http1: incomplete head")

// EqualFold reports whether b equals the ASCII string s, ignoring ASCII case (no allocation).
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
