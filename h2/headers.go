package h2

import (
	"errors"
	"strings"

	"golang.org/x/net/http2/hpack"
)

// Header-field validation for a decoded header block (RFC 9113 §8.2, §8.3).
// Side-neutral: fieldChecker validates a request block (the server side), a
// response block (the client side) or trailers, fed one field at a time by
// an hpack.Decoder's emit function so no block is decoded twice.

// Errors name the rule broken; a stream carrying one is reset with
// PROTOCOL_ERROR.
var (
	errFieldName        = errors.New("h2: header field name invalid (must be a lowercase token)")
	errFieldValue       = errors.New("h2: header field value contains a control character")
	errPseudoAfter      = errors.New("h2: pseudo-header field after a regular field")
	errPseudoUnknown    = errors.New("h2: unknown or misplaced pseudo-header field")
	errPseudoDup        = errors.New("h2: duplicate pseudo-header field")
	errPseudoMissing    = errors.New("h2: required pseudo-header field missing or empty")
	errConnSpecific     = errors.New("h2: connection-specific header field")
	errTE               = errors.New("h2: te header field other than one \"trailers\" (or empty)")
	errContentLength    = errors.New("h2: content-length invalid or inconsistent")
	errAuthorityHost    = errors.New("h2: :authority and host differ")
	errScheme           = errors.New("h2: :scheme is neither http nor https")
	errPath             = errors.New("h2: :path is not origin-form or \"*\", or has a bad %-escape")
	errAuthority        = errors.New("h2: :authority or host invalid")
	errTrailerPseudo    = errors.New("h2: pseudo-header field in trailers")
	errHeaderListTooBig = errors.New("h2: decoded header list exceeds the limit")
)

type blockKind uint8

const (
	blockRequest blockKind = iota
	blockResponse
	blockTrailers
)

const (
	sawMethod = 1 << iota
	sawScheme
	sawAuthority
	sawPath
	sawStatus
)

// fieldChecker accumulates and validates one header block.
type fieldChecker struct {
	kind       blockKind
	maxSize    uint32 // decoded size limit (name+value+32 per field), 0 = none
	size       uint32
	tooLarge   bool
	err        error
	sawRegular bool
	sawTE      bool
	pseudo     uint8

	method, scheme, authority, path, status, host string
	contentLength                                 int64 // -1 when absent
	fields                                        []hpack.HeaderField
}

func (c *fieldChecker) reset(kind blockKind, maxSize uint32, fields []hpack.HeaderField) {
	*c = fieldChecker{kind: kind, maxSize: maxSize, contentLength: -1, fields: fields[:0]}
}

// add validates and records one decoded field; the first error sticks.
func (c *fieldChecker) add(f hpack.HeaderField) {
	if c.err != nil || c.tooLarge {
		return
	}
	c.size += f.Size()
	if c.maxSize > 0 && c.size > c.maxSize {
		c.tooLarge = true
		return
	}
	if !validFieldValue(f.Value) {
		c.err = errFieldValue
		return
	}
	if len(f.Name) > 0 && f.Name[0] == ':' {
		c.addPseudo(f)
		return
	}
	c.sawRegular = true
	if !validFieldName(f.Name) {
		c.err = errFieldName
		return
	}
	switch f.Name {
	case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
		c.err = errConnSpecific
		return
	case "te":
		// RFC 9113 §8.2.2: "trailers" or nothing else. An empty
		// value is an empty list (RFC 9110 §10.1.4), which x/net
		// accepts too; a second te field is refused, as x/net does,
		// rather than joined into a list this check never saw whole.
		if c.kind == blockRequest && (c.sawTE || f.Value != "trailers" && f.Value != "") {
			c.err = errTE
			return
		}
		c.sawTE = true
	case "content-length":
		if c.kind == blockTrailers {
			break
		}
		n, ok := parseContentLength(f.Value)
		if !ok || (c.contentLength >= 0 && c.contentLength != n) {
			c.err = errContentLength
			return
		}
		c.contentLength = n
	case "host":
		if c.kind == blockRequest {
			if c.host != "" {
				c.err = errAuthorityHost
				return
			}
			c.host = f.Value
		}
	}
	c.fields = append(c.fields, f)
}

func (c *fieldChecker) addPseudo(f hpack.HeaderField) {
	if c.sawRegular {
		c.err = errPseudoAfter
		return
	}
	var bit uint8
	var dst *string
	switch {
	case c.kind == blockTrailers:
		c.err = errTrailerPseudo
		return
	case c.kind == blockResponse && f.Name == ":status":
		bit, dst = sawStatus, &c.status
	case c.kind == blockRequest && f.Name == ":method":
		bit, dst = sawMethod, &c.method
	case c.kind == blockRequest && f.Name == ":scheme":
		bit, dst = sawScheme, &c.scheme
	case c.kind == blockRequest && f.Name == ":authority":
		bit, dst = sawAuthority, &c.authority
	case c.kind == blockRequest && f.Name == ":path":
		bit, dst = sawPath, &c.path
	default:
		c.err = errPseudoUnknown
		return
	}
	if c.pseudo&bit != 0 {
		c.err = errPseudoDup
		return
	}
	c.pseudo |= bit
	*dst = f.Value
}

// finish applies the whole-block rules once END_HEADERS arrived.
func (c *fieldChecker) finish() error {
	if c.tooLarge {
		return errHeaderListTooBig
	}
	if c.err != nil {
		return c.err
	}
	switch c.kind {
	case blockResponse:
		if c.pseudo&sawStatus == 0 || len(c.status) != 3 {
			return errPseudoMissing
		}
	case blockRequest:
		if c.method == "CONNECT" {
			// RFC 9113 §8.5: only :method and :authority.
			if c.pseudo != sawMethod|sawAuthority || c.authority == "" {
				return errPseudoMissing
			}
		} else {
			if c.pseudo&(sawMethod|sawScheme|sawPath) != sawMethod|sawScheme|sawPath ||
				c.method == "" || c.scheme == "" || c.path == "" {
				return errPseudoMissing
			}
			// A proxy serves http and https URIs only (§8.3.1), whose
			// :path is origin-form or "*", with valid %-escapes.
			if c.scheme != "http" && c.scheme != "https" {
				return errScheme
			}
			if !validRequestPath(c.path) {
				return errPath
			}
		}
		authority := c.authority
		if authority == "" {
			authority = c.host
		}
		// Only bytes a host[:port] may hold, as x/net's server: this also
		// refuses userinfo ("@"), which §8.3.1 forbids.
		if !validAuthority(authority) {
			return errAuthority
		}
		// RFC 9113 §8.3.1: a host field must not name another authority.
		if c.host != "" && c.pseudo&sawAuthority != 0 && !strings.EqualFold(c.host, c.authority) {
			return errAuthorityHost
		}
	}
	return nil
}

// validFieldName: a non-empty lowercase token (RFC 9110 §5.1, RFC 9113 §8.2.1).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenLower[s[i]] {
			return false
		}
	}
	return true
}

// validFieldValue rejects control characters other than HTAB, as x/net's
// server does (NUL, CR and LF are what RFC 9113 §8.2.1 requires; DEL and
// the rest of C0 are rejected too so we agree with x/net on every request).
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

var tokenLower = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// parseContentLength accepts 1*DIGIT without sign, spaces or overflow.
func parseContentLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// validRequestPath: "*", or "/..." whose %-escapes before any query are
// well formed (what url.ParseRequestURI, x/net's check, accepts).
func validRequestPath(p string) bool {
	if p == "*" {
		return true
	}
	if p == "" || p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '?':
			return true
		case '%':
			if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
				return false
			}
		}
	}
	return true
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

func validAuthority(a string) bool {
	for i := 0; i < len(a); i++ {
		if !hostByte[a[i]] {
			return false
		}
	}
	return true
}

// hostByte: the bytes of uri-host [":" port], leniently (x/net's set).
var hostByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!$%&()*+,-.:;=['])_~" {
		t[c] = true
	}
	return t
}()
