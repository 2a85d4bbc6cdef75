package exchange

import "golang.org/x/net/http2/hpack"

// TrailerMayCarry reports whether a trailer field named name (lower
// case, as HTTP/2 carries it) passes into an HTTP/1.1 chunked body's
// trailer section: framing, routing and hop-by-hop fields may not be
// trailers (RFC 9110 §6.5.1), whichever side the trailers come from.
func TrailerMayCarry(name string) bool {
	switch name {
	case "content-length", "transfer-encoding", "host", "connection", "keep-alive", "te", "trailer", "upgrade":
		return false
	}
	return true
}

// AppendHTTP1Trailers writes HTTP/2 trailer fields as HTTP/1.1 field
// lines (those TrailerMayCarry lets through), each name written by
// appendName: as it is for an upstream, canonical for a client.
func AppendHTTP1Trailers(b []byte, fields []hpack.HeaderField, appendName func([]byte, string) []byte) []byte {
	for _, f := range fields {
		if !TrailerMayCarry(f.Name) {
			continue
		}
		b = appendName(b, f.Name)
		b = append(b, ": "...)
		b = append(b, f.Value...)
		b = append(b, "\r\n"...)
	}
	return b
}
