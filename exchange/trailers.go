package exchange

import (
	"github.com/hotproxy/hotproxy/http1"
	"golang.org/x/net/http2/hpack"
)

// Trailers cross the proxy under two rules, one per direction, for every
// pair of client and upstream protocol.
//
// A request's trailer section comes after the body, when the head's
// fields have been checked and rewritten: a backend that merges trailers
// into the header section (Go's net/http hands them out in
// Request.Trailer, frameworks merge them) would otherwise take from it
// what the head may not say. RequestTrailerMayCarry keeps only what RFC
// 9110 §6.5.1 lets a trailer carry and nothing the proxy sets or strips
// in the head (ForwardedFields): no framing, routing, request modifiers,
// authentication, content metadata, hop-by-hop fields, forwarding fields
// or request ids.
//
// A response's trailers come from the backend the proxy chose: they keep
// all but framing, routing and hop-by-hop fields (TrailerMayCarry), so
// grpc-status and grpc-message pass.

// TrailerMayCarry reports whether a response trailer field named name
// (lower case, as HTTP/2 carries it) passes to the client: framing,
// routing and hop-by-hop fields may not be trailers (RFC 9110 §6.5.1).
func TrailerMayCarry(name string) bool {
	switch name {
	case "content-length", "transfer-encoding", "host", "connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection":
		return false
	}
	return true
}

// RequestTrailerMayCarry reports whether a client's request trailer field
// named name (any case; '_' for '-' too where a backend folds the two)
// may go upstream. It does not allocate.
func RequestTrailerMayCarry(name string) bool {
	if upstreamFieldOf(name, false) != fieldForward {
		// X-Forwarded-*, Forwarded, X-Real-IP, X-Request-Id,
		// Proxy-Authorization, HTTP2-Settings: the proxy's own in
		// the head, never the client's in a trailer.
		return false
	}
	switch len(name) {
	case 2:
		return !foldName(name, "te")
	case 4:
		return !foldName(name, "host")
	case 5:
		return !foldName(name, "range")
	case 6:
		return !foldName(name, "expect") && !foldName(name, "pragma")
	case 7:
		return !foldName(name, "trailer") && !foldName(name, "upgrade")
	case 8:
		return !foldName(name, "if-match") && !foldName(name, "if-range")
	case 10:
		return !foldName(name, "connection") && !foldName(name, "keep-alive")
	case 12:
		return !foldName(name, "content-type") && !foldName(name, "max-forwards")
	case 13:
		return !foldName(name, "authorization") && !foldName(name, "cache-control") &&
			!foldName(name, "content-range") && !foldName(name, "if-none-match")
	case 14:
		return !foldName(name, "content-length")
	case 16:
		return !foldName(name, "content-encoding") && !foldName(name, "proxy-connection") &&
			!foldName(name, "www-authenticate")
	case 17:
		return !foldName(name, "transfer-encoding") && !foldName(name, "if-modified-since")
	case 19:
		return !foldName(name, "if-unmodified-since")
	}
	return true
}

// AppendHTTP1Trailers writes an upstream's HTTP/2 response trailer fields
// as HTTP/1.1 field lines (those TrailerMayCarry lets through), each name
// written by appendName (canonical for a client).
func AppendHTTP1Trailers(b []byte, fields []hpack.HeaderField, appendName func([]byte, string) []byte) []byte {
	return appendHTTP1TrailersIf(b, fields, TrailerMayCarry, appendName)
}

// KeepResponseTrailers removes from an upstream's HTTP/2 response
// trailer fields, in place, those TrailerMayCarry refuses, and returns
// the rest (fields' own array: the caller gives up the list).
func KeepResponseTrailers(fields []hpack.HeaderField) []hpack.HeaderField {
	return keepTrailersIf(fields, TrailerMayCarry)
}

// keepTrailersIf keeps, in place, the fields that may passes, and
// returns them (fields' own array; what is left behind is cleared).
func keepTrailersIf(fields []hpack.HeaderField, may func(string) bool) []hpack.HeaderField {
	kept := fields[:0]
	for _, f := range fields {
		if may(f.Name) {
			kept = append(kept, f)
		}
	}
	clear(fields[len(kept):])
	return kept
}

// AppendHTTP1RequestTrailers writes a client's HTTP/2 request trailer
// fields as HTTP/1.1 field lines, those RequestTrailerMayCarry lets
// through, each name written by appendName.
func AppendHTTP1RequestTrailers(b []byte, fields []hpack.HeaderField, appendName func([]byte, string) []byte) []byte {
	return appendHTTP1TrailersIf(b, fields, RequestTrailerMayCarry, appendName)
}

// appendHTTP1TrailersIf writes the fields that may passes as HTTP/1.1
// field lines.
func appendHTTP1TrailersIf(b []byte, fields []hpack.HeaderField, may func(string) bool, appendName func([]byte, string) []byte) []byte {
	for _, f := range fields {
		if may(f.Name) {
			b = appendHTTP1Field(b, f.Name, f.Value, appendName)
		}
	}
	return b
}

func appendHTTP1Field(b []byte, name, value string, appendName func([]byte, string) []byte) []byte {
	b = appendName(b, name)
	b = append(b, ": "...)
	b = append(b, value...)
	return append(b, "\r\n"...)
}

// KeepRequestTrailers removes from a client's HTTP/2 request trailer
// fields, in place, those RequestTrailerMayCarry refuses, and returns
// the rest (fields' own array: the caller gives up the list).
func KeepRequestTrailers(fields []hpack.HeaderField) []hpack.HeaderField {
	return keepTrailersIf(fields, RequestTrailerMayCarry)
}

// AppendHTTP1RequestTrailer re-writes an HTTP/1.1 client's chunked
// trailer section (field lines with their CRLFs, as http1.ChunkedDecoder
// validated it) field by field: those RequestTrailerMayCarry lets through
// and f's request did not name in Connection. Names and values are
// written as the client spelt them. It does not allocate beyond b.
func (f *ForwardedFields) AppendHTTP1RequestTrailer(b, trailer []byte) []byte {
	for pos := 0; ; {
		name, value, next, ok := f.nextKeptTrailerField(trailer, pos)
		if !ok {
			return b
		}
		pos = next
		b = append(b, name...)
		b = append(b, ": "...)
		b = append(b, value...)
		b = append(b, "\r\n"...)
	}
}

// AppendHTTP2RequestTrailer is AppendHTTP1RequestTrailer for an HTTP/2
// upstream: the fields of an HTTP/1.1 client's chunked trailer section
// that pass, appended to fields with their names in lower case (RFC 9113
// §8.2.2). Their names and values are copied into one buffer of their
// own, made for the request (a request with trailers allocates once;
// one without never comes here), so trailer's bytes may be reused as
// soon as it returns.
func (f *ForwardedFields) AppendHTTP2RequestTrailer(fields []hpack.HeaderField, trailer []byte) []hpack.HeaderField {
	// Names and values fit in the section's length, so buf never grows
	// and the strings made over it stay where they are.
	buf := make([]byte, 0, len(trailer))
	for pos := 0; ; {
		name, value, next, ok := f.nextKeptTrailerField(trailer, pos)
		if !ok {
			return fields
		}
		pos = next
		start := len(buf)
		for _, c := range name {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			buf = append(buf, c)
		}
		mid := len(buf)
		buf = append(buf, value...)
		fields = append(fields, hpack.HeaderField{Name: bytesString(buf[start:mid]), Value: bytesString(buf[mid:])})
	}
}

// nextKeptTrailerField is http1.NextTrailerField skipping the fields
// that RequestTrailerMayCarry refuses and those f's request named in
// Connection.
func (f *ForwardedFields) nextKeptTrailerField(trailer []byte, pos int) (name, value []byte, next int, ok bool) {
	for {
		name, value, next, ok = http1.NextTrailerField(trailer, pos)
		if !ok || RequestTrailerMayCarry(bytesString(name)) && !f.connectionNamed(name) {
			return name, value, next, ok
		}
		pos = next
	}
}

// maxConnectionNamed bounds the bytes of the field names an HTTP/1.1
// request's Connection header named (beyond the hop-by-hop ones) that a
// trailer is checked against; past it every trailer field is dropped.
const maxConnectionNamed = 128

// NoteConnection records the field names an HTTP/1.1 request's
// Connection field value lists: stripped from the head as hop-by-hop
// (RFC 9110 §7.6.1), none may come back in the trailer either. Call it
// after Reset, with each Connection field's value.
func (f *ForwardedFields) NoteConnection(value []byte) {
	for len(value) > 0 {
		name := value
		if i := indexByte(value, ','); i >= 0 {
			name, value = value[:i], value[i+1:]
		} else {
			value = nil
		}
		name = trimOWS(name)
		if len(name) == 0 || !RequestTrailerMayCarry(bytesString(name)) {
			continue // refused in a trailer anyway (close, keep-alive, upgrade...)
		}
		if f.connNamedLen+len(name)+1 > maxConnectionNamed {
			f.connNamedOverflow = true
			return
		}
		f.connNamedLen += copy(f.connNamed[f.connNamedLen:], name)
		f.connNamed[f.connNamedLen] = ','
		f.connNamedLen++
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// connectionNamed reports whether the request's Connection header named
// name (or named more than maxConnectionNamed holds).
func (f *ForwardedFields) connectionNamed(name []byte) bool {
	if f.connNamedOverflow {
		return true
	}
	names := f.connNamed[:f.connNamedLen]
	for len(names) > 0 {
		i := 0
		for names[i] != ',' {
			i++
		}
		if http1.EqualFoldBytes(names[:i], name) {
			return true
		}
		names = names[i+1:]
	}
	return false
}
