package http1

import "bytes"

// fieldKind is what the parser needs to know about a field name.
type fieldKind uint8

const (
	kindOther fieldKind = iota
	kindHost
	kindContentLength
	kindTransferEncoding
	kindConnection
	kindUpgrade
	kindExpect
	kindTrailer
	kindHopOnly // Keep-Alive, Proxy-Connection, TE: not forwarded, nothing else to do
)

func classify(name []byte) fieldKind {
	switch len(name) {
	case 2:
		if EqualFold(name, "te") {
			return kindHopOnly
		}
	case 4:
		if EqualFold(name, "host") {
			return kindHost
		}
	case 6:
		if EqualFold(name, "expect") {
			return kindExpect
		}
	case 7:
		if EqualFold(name, "upgrade") {
			return kindUpgrade
		}
		if EqualFold(name, "trailer") {
			return kindTrailer
		}
	case 10:
		if EqualFold(name, "connection") {
			return kindConnection
		}
		if EqualFold(name, "keep-alive") {
			return kindHopOnly
		}
	case 14:
		if EqualFold(name, "content-length") {
			return kindContentLength
		}
	case 16:
		if EqualFold(name, "proxy-connection") {
			return kindHopOnly
		}
	case 17:
		if EqualFold(name, "transfer-encoding") {
			return kindTransferEncoding
		}
	}
	return kindOther
}

// nextLine finds the CRLF that ends the line starting at pos within
// buf[:limit] and returns the index of its CR. It returns -1 with
// errIncomplete when no LF is there yet, and an error for a bare LF.
func nextLine(buf []byte, pos, limit int) (int, errCode) {
	if limit > len(buf) {
		limit = len(buf)
	}
	lf := bytes.IndexByte(buf[pos:limit], '\n')
	if lf < 0 {
		return -1, errIncomplete
	}
	lf += pos
	if lf == pos || buf[lf-1] != '\r' {
		return -1, errBareLF
	}
	return lf - 1, errNone
}

// parseFieldLine parses the field line buf[start:end] (CRLF excluded) into f.
func parseFieldLine(buf []byte, start, end int, f *Field) errCode {
	if isOWS(buf[start]) {
		return errObsFold
	}
	i := start
	for i < end && isTchar[buf[i]] {
		i++
	}
	if i == end {
		return errNoColon
	}
	switch c := buf[i]; {
	case c == ':':
	case isOWS(c) && i > start:
		return errSpaceBeforeColon
	case c == '\r':
		return errBareCR
	default:
		return errBadFieldName
	}
	if i == start {
		return errEmptyFieldName
	}
	vs, ve := trimOWS(buf, i+1, end)
	for _, c := range buf[vs:ve] {
		if !isFieldVchar[c] {
			if c == '\r' {
				return errBareCR
			}
			return errBadFieldValue
		}
	}
	*f = Field{Name: Span{int32(start), int32(i)}, Value: Span{int32(vs), int32(ve)}}
	return errNone
}

// parseFieldLines parses the field lines that start at buf[pos] through
// the empty line that ends the head, never looking past buf[:maxHead].
// It returns the number of fields and the length of the head.
func parseFieldLines(buf []byte, pos, maxHead int, fields *[MaxHeaders]Field, kinds *[MaxHeaders]fieldKind) (n, headLen int, code errCode) {
	for {
		cr, code := nextLine(buf, pos, maxHead)
		if code == errIncomplete && len(buf) >= maxHead {
			return 0, 0, errHeadTooLarge
		}
		if code != errNone {
			return 0, 0, code
		}
		if cr == pos {
			return n, cr + 2, errNone
		}
		if n == MaxHeaders {
			return 0, 0, errTooManyFields
		}
		if code := parseFieldLine(buf, pos, cr, &fields[n]); code != errNone {
			return 0, 0, code
		}
		kinds[n] = classify(fields[n].Name.Bytes(buf))
		fields[n].Hop = kinds[n] != kindOther && kinds[n] != kindHost && kinds[n] != kindExpect
		n++
		pos = cr + 2
	}
}

// headFacts is what the field lines of a head say about framing and the
// connection, checked for consistency.
type headFacts struct {
	contentLength  int64
	hasLength      bool
	chunked        bool
	hosts          int
	host           Span
	upgrade        Span
	closeToken     bool // Connection: close
	keepAliveToken bool // Connection: keep-alive
	upgradeToken   bool // Connection: upgrade
	expectContinue bool
}

// analyzeFields checks the fields that frame the message or steer the
// connection and marks as Hop every field a Connection header names.
// Host and Expect only mean something in a request; in a response they
// are ordinary fields.
func analyzeFields(buf []byte, fields *[MaxHeaders]Field, kinds *[MaxHeaders]fieldKind, n int, minor uint8, request bool) (hf headFacts, code errCode) {
	var firstLength []byte // the first Content-Length value, to compare the others with
	teFields, upgrades := 0, 0
	for i := 0; i < n; i++ {
		value := fields[i].Value.Bytes(buf)
		kind := kinds[i]
		if !request && (kind == kindHost || kind == kindExpect) {
			kind = kindOther
		}
		switch kind {
		case kindHost:
			hf.hosts++
			hf.host = fields[i].Value
			if !validAuthority(value, false) {
				return hf, errBadHost
			}
		case kindContentLength:
			// Unlike other lists, no element may be empty: a field
			// "Content-Length:" next to "Content-Length: 0" is one a
			// peer may read as a second, differing length.
			for rest := value; ; {
				elem := rest
				comma := bytes.IndexByte(rest, ',')
				if comma >= 0 {
					elem, rest = rest[:comma], rest[comma+1:]
				}
				s, e := trimOWS(elem, 0, len(elem))
				elem = elem[s:e]
				if firstLength == nil {
					length, ok := parseContentLength(elem)
					if !ok {
						return hf, errBadContentLength
					}
					firstLength, hf.contentLength, hf.hasLength = elem, length, true
				} else if !bytes.Equal(elem, firstLength) {
					if _, ok := parseContentLength(elem); !ok {
						return hf, errBadContentLength
					}
					return hf, errContentLengthMismatch
				}
				if comma < 0 {
					break
				}
			}
		case kindTransferEncoding:
			teFields++
			if !EqualFold(value, "chunked") {
				return hf, errBadTransferEncoding
			}
			hf.chunked = true
		case kindUpgrade:
			upgrades++
			hf.upgrade = fields[i].Value
			elems := 0
			code := forEachListElement(value, func(elem []byte) errCode {
				elems++
				// protocol = protocol-name ["/" protocol-version]
				if slash := bytes.IndexByte(elem, '/'); slash >= 0 {
					if !isToken(elem[:slash]) || !isToken(elem[slash+1:]) {
						return errBadUpgrade
					}
				} else if !isToken(elem) {
					return errBadUpgrade
				}
				return errNone
			})
			if code != errNone {
				return hf, code
			}
			if elems == 0 {
				return hf, errBadUpgrade
			}
		case kindExpect:
			if EqualFold(value, "100-continue") {
				hf.expectContinue = true
			}
		case kindTrailer:
			code := forEachListElement(value, func(elem []byte) errCode {
				// RFC 9110 §6.5.1: framing fields never come in a trailer,
				// and net/http rejects a body that announces them.
				if !isToken(elem) || EqualFold(elem, "transfer-encoding") ||
					EqualFold(elem, "content-length") || EqualFold(elem, "trailer") {
					return errBadTrailerField
				}
				return errNone
			})
			if code != errNone {
				return hf, code
			}
		case kindConnection:
			code := forEachListElement(value, func(opt []byte) errCode {
				if !isToken(opt) {
					return errBadConnection
				}
				switch {
				case EqualFold(opt, "close"):
					hf.closeToken = true
				case EqualFold(opt, "keep-alive"):
					hf.keepAliveToken = true
				case EqualFold(opt, "upgrade"):
					hf.upgradeToken = true
				}
				for j := 0; j < n; j++ {
					if !fields[j].Hop && EqualFoldBytes(fields[j].Name.Bytes(buf), opt) {
						fields[j].Hop = true
					}
				}
				return errNone
			})
			if code != errNone {
				return hf, code
			}
		}
	}
	switch {
	case hf.hosts > 1:
		return hf, errSeveralHosts
	case teFields > 1:
		return hf, errSeveralTransferEncodings
	case teFields == 1 && minor == 0:
		// RFC 9112 §6.1: the framing of such a message is faulty.
		return hf, errTransferEncodingHTTP10
	case teFields == 1 && hf.hasLength:
		return hf, errLengthAndChunked
	case upgrades > 1:
		return hf, errSeveralUpgrades
	}
	if !hf.upgradeToken {
		hf.upgrade = Span{}
	}
	return hf, errNone
}

// forEachListElement calls fn with each non-empty element, OWS trimmed, of
// the comma-separated list b (RFC 9110 §5.6.1: empty elements are ignored),
// stopping at the first error.
func forEachListElement(b []byte, fn func([]byte) errCode) errCode {
	for len(b) > 0 {
		elem := b
		if comma := bytes.IndexByte(b, ','); comma >= 0 {
			elem, b = b[:comma], b[comma+1:]
		} else {
			b = nil
		}
		s, e := trimOWS(elem, 0, len(elem))
		if s == e {
			continue
		}
		if code := fn(elem[s:e]); code != errNone {
			return code
		}
	}
	return errNone
}

// parseContentLength parses 1*DIGIT into a non-negative int64.
func parseContentLength(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
