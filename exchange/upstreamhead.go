package exchange

import "unsafe"

// The upstream request head is written once for every pair of client and
// upstream protocol: a front end walks its request's fields (spans of an
// HTTP/1.1 head, an HTTP/2 stream's header list, an http.Header) through
// ForwardedFields.Take and writes those it keeps, then the proxy's own
// fields from ForwardedFields.Own, in whatever form its upstream
// transport takes them (HTTP/1.1 bytes, header fields for an HTTP/2
// stream). The decisions (hop-by-hop removal, the forwarding fields of
// issue 20, X-Request-Id, TE: trailers) are all here; the loops that
// write are a few lines each and decide nothing.

// Client is what the upstream head says of the client connection.
type Client struct {
	// IP is the client's address, as X-Forwarded-For ends with it.
	IP []byte
	// TLS: the connection is TLS (X-Forwarded-Proto: https). The
	// connection's scheme, not :scheme or an absolute-form target's,
	// which the client chose.
	TLS bool
	// TrustForwardedFor is the listener's trust_forwarded_for: a front
	// proxy's X-Forwarded-For, Forwarded and X-Real-IP pass.
	TrustForwardedFor bool
}

// ForwardedFields decides, field by field, what of a client's request
// head the upstream gets, and makes the fields the proxy adds. The zero
// value is not ready: call Reset for each request. It allocates nothing
// once its buffer has grown to a request's X-Forwarded-For, so that it
// can live in the HTTP/1.1 front end's pooled state.
type ForwardedFields struct {
	client  Client
	host    []byte
	toHTTP2 bool

	ids int    // the client's X-Request-Id fields
	id  []byte // the last one's value (the caller's bytes)
	// xff is the X-Forwarded-For value being built: the trusted prior
	// values, then the client's address.
	xff        []byte
	teTrailers bool // the client sent TE: trailers (passed to HTTP/2 only)
	newID      [32]byte
	own        int // the next field Own yields

	// connNamed holds the names, each ended by ',', of the fields an
	// HTTP/1.1 request's Connection header named, for its trailer
	// (NoteConnectionNamed).
	connNamed         [maxConnectionNamed]byte
	connNamedLen      int
	connNamedOverflow bool
}

// Reset readies f for a request to host (its Host or :authority; empty:
// none) from client, going to an HTTP/2 upstream when toHTTP2.
func (f *ForwardedFields) Reset(client Client, host []byte, toHTTP2 bool) {
	*f = ForwardedFields{client: client, host: host, toHTTP2: toHTTP2, xff: f.xff[:0]}
}

// Take looks at one of the client's request fields and reports whether
// it goes upstream as it is. Whether it does depends on its name alone,
// so a front end holding several values under one name may ask with any
// of them, but must show Take every value: the forwarding fields and
// X-Request-Id are taken in, to come out of Own. value is kept until Own
// has been read; it must stay valid that long.
func (f *ForwardedFields) Take(name, value []byte) bool {
	if hopByHop(name) {
		if len(name) == 2 && string(value) == "trailers" {
			// The one TE HTTP/2 allows (RFC 9113 §8.2.2): gRPC needs it.
			f.teTrailers = true
		}
		return false
	}
	switch upstreamFieldOf(bytesString(name), f.client.TrustForwardedFor) {
	case fieldDrop:
		return false
	case fieldForwardedFor:
		// The proxy's own in Own; a trusted front proxy's values head it.
		if f.client.TrustForwardedFor && len(value) > 0 {
			f.xff = append(f.xff, value...)
			f.xff = append(f.xff, ", "...)
		}
		return false
	case fieldRequestID:
		f.ids++
		f.id = value
		return false
	}
	return true
}

// The fields Own yields, in order.
const (
	ownForwardedFor = iota
	ownForwardedProto
	ownForwardedHost
	ownRequestID
	ownTE
	ownFields
)

// Own returns the next of the fields the proxy adds (ok false past the
// last; call it after every Take): X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host when the
// request named a host, X-Request-Id (the client's when it sent exactly
// one valid id, a new one otherwise: two are one too many to choose
// from), and TE: trailers to an HTTP/2 upstream when the client asked
// for trailers. Names are in canonical form (http.CanonicalHeaderKey's);
// an HTTP/2 transport lower-cases them. value is valid until the next
// Reset.
func (f *ForwardedFields) Own() (name string, value []byte, ok bool) {
	for f.own < ownFields {
		i := f.own
		f.own++
		switch i {
		case ownForwardedFor:
			f.xff = append(f.xff, f.client.IP...)
			return "X-Forwarded-For", f.xff, true
		case ownForwardedProto:
			if f.client.TLS {
				return "X-Forwarded-Proto", schemeHTTPS, true
			}
			return "X-Forwarded-Proto", schemeHTTP, true
		case ownForwardedHost:
			if len(f.host) > 0 {
				return "X-Forwarded-Host", f.host, true
			}
		case ownRequestID:
			if f.ids == 1 && validRequestID(f.id) {
				return "X-Request-Id", f.id, true
			}
			return "X-Request-Id", appendRequestID(f.newID[:0]), true
		case ownTE:
			if f.toHTTP2 && f.teTrailers {
				return "Te", valueTrailers, true
			}
		}
	}
	return "", nil, false
}

var (
	schemeHTTP    = []byte("http")
	schemeHTTPS   = []byte("https")
	valueTrailers = []byte("trailers")
)

// AppendHTTP1 appends what Own yields as HTTP/1.1 field lines.
func (f *ForwardedFields) AppendHTTP1(b []byte) []byte {
	for {
		name, value, ok := f.Own()
		if !ok {
			return b
		}
		b = append(b, name...)
		b = append(b, ": "...)
		b = append(b, value...)
		b = append(b, "\r\n"...)
	}
}

// bytesString views b as a string without copying, for reads that do not
// keep it.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// AppendHTTP1RequestLine appends an HTTP/1.1 upstream request's first
// lines: the request line and Host, which goes first and always: a
// Connection header that names it (the RFC makes it hop-by-hop then)
// must not strip it, and a request without one (HTTP/1.0, an HTTP/2
// request without :authority) still gets one, fallbackHost (the
// cluster's name).
func AppendHTTP1RequestLine(b, method, target, host []byte, fallbackHost string) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	if len(host) > 0 {
		b = append(b, host...)
	} else {
		b = append(b, fallbackHost...)
	}
	return append(b, "\r\n"...)
}

// Body lengths for AppendHTTP1Framing besides a Content-Length.
const (
	BodyChunked int64 = -1 // a body of unknown length: chunked
	BodyNone    int64 = -2 // no body, and no framing field
)

// AppendHTTP1Framing appends the framing field of the proxy's own for a
// request body of length n (or BodyChunked, BodyNone): the client's
// framing never passes as it came (RFC 9112 §6.3: one message, one
// reading).
func AppendHTTP1Framing(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		b = append(b, "Content-Length: "...)
		b = appendInt(b, n)
		return append(b, "\r\n"...)
	case n == BodyChunked:
		return append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	return b
}

func appendInt(b []byte, n int64) []byte {
	var d [20]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(b, d[i:]...)
}

// Response bodies toward an HTTP/1.1 client, for
// AppendHTTP1ResponseFraming, besides a Content-Length (n >= 0).
const (
	ClientBodyNone       int64 = -1 // no body (HEAD, 1xx, 204, 304): no framing field of the proxy's
	ClientBodyChunked    int64 = -2 // chunked (trailers included)
	ClientBodyUntilClose int64 = -3 // the body ends with the connection (HTTP/1.0, or an upstream that said so)
)

// AppendHTTP1ResponseFraming appends the framing field a response to an
// HTTP/1.1 client gets for a body of n bytes (or ClientBodyChunked); for
// ClientBodyNone and ClientBodyUntilClose it appends nothing.
func AppendHTTP1ResponseFraming(b []byte, n int64) []byte {
	switch {
	case n >= 0:
		b = append(b, "Content-Length: "...)
		b = appendInt(b, n)
		return append(b, "\r\n"...)
	case n == ClientBodyChunked:
		return append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	return b
}
