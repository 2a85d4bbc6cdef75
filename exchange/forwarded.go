package exchange

import (
	"math/rand/v2"
	"strings"
)

// What the proxy does with a client's request field on its way upstream:
// one decision for every pair of client and upstream protocol, taken by
// ForwardedFields.
//
// The fields that say who the client is and how it came (X-Forwarded-*,
// Forwarded, X-Real-IP) and the request id are the proxy's to set: a
// client's own would let it pose as another address or scheme. Each is
// matched in every spelling a backend may read as it: case aside, '_'
// for '-' too, since CGI, WSGI, PHP and Rack fold both into one
// HTTP_X_FORWARDED_FOR and nginx can be told to accept underscores.
type upstreamField uint8

const (
	fieldForward upstreamField = iota
	// fieldDrop: never forwarded.
	fieldDrop
	// fieldForwardedFor: X-Forwarded-For spelt so: not forwarded as it
	// is; with trust_forwarded_for its values head the proxy's own.
	fieldForwardedFor
	// fieldRequestID: X-Request-Id spelt so: forwarded only as the one
	// X-Request-Id, and only when valid (upstreamRequestID).
	fieldRequestID
)

// upstreamFieldOf classifies a request field name. trusted is the
// listener's trust_forwarded_for: then a front proxy's Forwarded and
// X-Real-IP pass, as its X-Forwarded-For does; their '_' spellings never
// (a front proxy writes '-', a client smuggling past it '_'). It does not
// allocate.
func upstreamFieldOf(name string, trusted bool) upstreamField {
	switch len(name) {
	case 9: // forwarded, x-real-ip
		switch {
		case foldName(name, "forwarded"):
			if trusted {
				return fieldForward
			}
			return fieldDrop
		case foldName(name, "x-real-ip"):
			if trusted && !strings.Contains(name, "_") {
				return fieldForward
			}
			return fieldDrop
		}
	case 12: // x-request-id
		if foldName(name, "x-request-id") {
			if !strings.Contains(name, "_") {
				return fieldRequestID
			}
			return fieldDrop
		}
	case 14: // http2-settings
		if foldName(name, "http2-settings") {
			// An h2c upgrade's parameters, meaningless to anyone but the
			// hop that would upgrade: h2c upgrades are never forwarded.
			return fieldDrop
		}
	case 15: // x-forwarded-for
		if foldName(name, "x-forwarded-for") {
			if !strings.Contains(name, "_") {
				return fieldForwardedFor
			}
			return fieldDrop
		}
	case 16, 17: // x-forwarded-host, x-forwarded-proto
		if foldName(name, "x-forwarded-host") || foldName(name, "x-forwarded-proto") {
			return fieldDrop // replaced by the proxy's own
		}
	case 18, 19: // proxy-authenticate, proxy-authorization
		if foldName(name, "proxy-authorization") || foldName(name, "proxy-authenticate") {
			return fieldDrop // meant for this hop: credentials for a proxy
		}
	}
	return fieldForward
}

// equalFold reports whether name is lower but for ASCII case.
func equalFold(name []byte, lower string) bool {
	if len(name) != len(lower) {
		return false
	}
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// foldName reports whether name is lower (lower case, '-' between
// words) but for case and '_' in place of '-'.
func foldName(name, lower string) bool {
	if len(name) != len(lower) {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '_':
			c = '-'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// maxRequestIDLen bounds a client's X-Request-Id: a UUID is 36 bytes, a
// trace context header 55; 4 KB ids twice over (issue 20) fill backends'
// logs and indexes.
const maxRequestIDLen = 128

// validRequestID reports whether a client's X-Request-Id may be kept:
// 1 to maxRequestIDLen bytes of letters, digits and - . _ ~ : + / =
// (UUIDs, hex and base64 ids, ULIDs, AWS trace ids without ';'), nothing
// a log line or a header list could be split at.
func validRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxRequestIDLen {
		return false
	}
	for _, c := range id {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == ':', c == '+', c == '/', c == '=':
		default:
			return false
		}
	}
	return true
}

// appendRequestID appends 32 random hex digits. Not a secret: math/rand
// is enough to tell requests apart.
func appendRequestID(b []byte) []byte {
	const hexDigits = "0123456789abcdef"
	for range 2 {
		v := rand.Uint64()
		for range 16 {
			b = append(b, hexDigits[v&15])
			v >>= 4
		}
	}
	return b
}

// hopByHop reports whether name is a field of one connection, never
// forwarded as it is (RFC 9110 §7.6.1, RFC 9113 §8.2.2), or one the
// proxy writes itself: Host (from the request's authority) and
// Content-Length (from the body's framing). An HTTP/1.1 front end also
// leaves out the fields its Connection header names.
func hopByHop(name []byte) bool {
	switch len(name) {
	case 2:
		return equalFold(name, "te")
	case 4:
		return equalFold(name, "host")
	case 7:
		return equalFold(name, "upgrade") || equalFold(name, "trailer")
	case 10:
		return equalFold(name, "connection") || equalFold(name, "keep-alive")
	case 14:
		return equalFold(name, "content-length")
	case 16:
		return equalFold(name, "proxy-connection")
	case 17:
		return equalFold(name, "transfer-encoding")
	}
	return false
}
