package h2

import (
	"fmt"

	"golang.org/x/net/http2/hpack"
)

// clientHeadKind classifies a decoded response header block.
type clientHeadKind uint8

const (
	clientHeadFinal         clientHeadKind = iota // 2xx..5xx: the response head
	clientHeadInformational                       // 1xx other than 101: skipped
)

// clientTokenChar: RFC 9110 tchar, lower case only (RFC 9113 §8.2.1: a
// field name with an upper-case letter is malformed).
var clientTokenChar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// clientConnectionSpecific are the fields RFC 9113 §8.2.2 forbids in
// HTTP/2 (te is handled apart: "trailers" is its only legal value).
func clientConnectionSpecific(name string) bool {
	switch name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		return true
	}
	return false
}

func clientValidName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !clientTokenChar[name[i]] {
			return false
		}
	}
	return true
}

// clientValidValue: RFC 9113 §8.2.1: no NUL, CR or LF, no leading or
// trailing space or tab.
func clientValidValue(v string) bool {
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case 0, '\r', '\n':
			return false
		}
	}
	if v != "" && (v[0] == ' ' || v[0] == '\t' || v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		return false
	}
	return true
}

// clientCheckRegularField checks one non-pseudo field, request or
// response side.
func clientCheckRegularField(f hpack.HeaderField) error {
	if !clientValidName(f.Name) {
		return fmt.Errorf("field name %q is not a lower-case token", f.Name)
	}
	if clientConnectionSpecific(f.Name) {
		return fmt.Errorf("connection-specific field %q is not allowed in HTTP/2", f.Name)
	}
	if f.Name == "te" && f.Value != "trailers" {
		return fmt.Errorf("field te: %q (only \"trailers\" is allowed in HTTP/2)", f.Value)
	}
	if !clientValidValue(f.Value) {
		return fmt.Errorf("field %q: value has NUL, CR, LF or surrounding white space", f.Name)
	}
	return nil
}

// clientParseContentLength parses a content-length value: digits only,
// no sign, no list, at most 18 digits (no overflow).
func clientParseContentLength(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// clientCheckResponseHead validates a response header block (RFC 9113
// §8.3.2): exactly one :status, three digits, first; no other
// pseudo-header; valid regular fields; content-length a single number
// (repeated only with the same value). contentLength is -1 when absent.
func clientCheckResponseHead(fields []hpack.HeaderField) (status int, contentLength int64, kind clientHeadKind, err error) {
	status, contentLength = -1, -1
	regular := false
	for _, f := range fields {
		if len(f.Name) > 0 && f.Name[0] == ':' {
			if regular {
				return 0, 0, 0, fmt.Errorf("pseudo-header %q after a regular field", f.Name)
			}
			if f.Name != ":status" {
				return 0, 0, 0, fmt.Errorf("pseudo-header %q is not allowed in a response", f.Name)
			}
			if status != -1 {
				return 0, 0, 0, fmt.Errorf("repeated :status")
			}
			v := f.Value
			if len(v) != 3 || v[0] < '1' || v[0] > '5' || v[1] < '0' || v[1] > '9' || v[2] < '0' || v[2] > '9' {
				return 0, 0, 0, fmt.Errorf(":status %q is not a three-digit code 100..599", v)
			}
			status = int(v[0]-'0')*100 + int(v[1]-'0')*10 + int(v[2]-'0')
			continue
		}
		regular = true
		if err := clientCheckRegularField(f); err != nil {
			return 0, 0, 0, err
		}
		if f.Name == "content-length" {
			n, ok := clientParseContentLength(f.Value)
			if !ok {
				return 0, 0, 0, fmt.Errorf("content-length %q is not a number", f.Value)
			}
			if contentLength != -1 && contentLength != n {
				return 0, 0, 0, fmt.Errorf("conflicting content-length values %d and %d", contentLength, n)
			}
			contentLength = n
		}
	}
	if status == -1 {
		return 0, 0, 0, fmt.Errorf("no :status pseudo-header")
	}
	if status == 101 {
		return 0, 0, 0, fmt.Errorf(":status 101 is not allowed in HTTP/2")
	}
	if status < 200 {
		return status, contentLength, clientHeadInformational, nil
	}
	return status, contentLength, clientHeadFinal, nil
}

// clientCheckTrailers validates a trailer block: no pseudo-header
// (RFC 9113 §8.1), valid regular fields.
func clientCheckTrailers(fields []hpack.HeaderField) error {
	for _, f := range fields {
		if len(f.Name) > 0 && f.Name[0] == ':' {
			return fmt.Errorf("pseudo-header %q in trailers", f.Name)
		}
		if err := clientCheckRegularField(f); err != nil {
			return err
		}
	}
	return nil
}

// clientHeaderListSize is the RFC 9113 §6.5.2 size of a field list:
// name and value lengths plus 32 per field.
func clientHeaderListSize(fields []hpack.HeaderField) uint64 {
	var n uint64
	for _, f := range fields {
		n += uint64(len(f.Name)) + uint64(len(f.Value)) + 32
	}
	return n
}
