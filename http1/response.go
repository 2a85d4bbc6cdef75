package http1

// Response is a parsed response head. Its spans index the buffer it was
// parsed from and are stale once that buffer is refilled or moved.
type Response struct {
	Minor         uint8
	Status        int // 100-599
	Reason        Span
	Fields        [MaxHeaders]Field
	NFields       int
	HeadLen       int
	Framing       Framing
	ContentLength int64
	Close         bool // the upstream closes after this response (Connection: close, HTTP/1.0 without keep-alive, or FramingUntilClose)
}

// Parse parses a response head to a request with method reqMethod (framing:
// HEAD, 1xx, 204, 304 and a 2xx to CONNECT have no body whatever the headers say).
// Errors are ErrIncomplete or an *Error with Status 502. The framing
// fields are checked even when the response has no body: an upstream that
// gets them wrong is not one to keep a connection to. Like Request.Parse
// it reads buf from its start: call it again when new bytes hold a '\n'.
func (r *Response) Parse(buf []byte, lim Limits, reqMethod []byte) error {
	lim = lim.withDefaults()
	r.reset()
	if code := r.parse(buf, lim, reqMethod); code != errNone {
		r.reset()
		return code.response()
	}
	return nil
}

// reset zeroes everything but Fields, which NFields bounds.
func (r *Response) reset() {
	r.Minor, r.Status, r.Reason = 0, 0, Span{}
	r.NFields, r.HeadLen = 0, 0
	r.Framing, r.ContentLength, r.Close = FramingNone, 0, false
}

func (r *Response) parse(buf []byte, lim Limits, reqMethod []byte) errCode {
	cr, code := nextLine(buf, 0, lim.MaxHeadBytes)
	if code == errIncomplete && len(buf) >= lim.MaxHeadBytes {
		return errHeadTooLarge
	}
	if code != errNone {
		return code
	}
	if cr == 0 {
		return errLeadingEmptyLine
	}
	if code := r.parseStatusLine(buf, cr); code != errNone {
		return code
	}
	var kinds [MaxHeaders]fieldKind
	n, headLen, code := parseFieldLines(buf, cr+2, lim.MaxHeadBytes, &r.Fields, &kinds)
	if code != errNone {
		return code
	}
	r.NFields, r.HeadLen = n, headLen
	hf, code := analyzeFields(buf, &r.Fields, &kinds, n, r.Minor, false)
	if code != errNone {
		return code
	}

	switch {
	case string(reqMethod) == "HEAD", r.Status < 200, r.Status == 204, r.Status == 304,
		r.Status < 300 && string(reqMethod) == "CONNECT":
		r.Framing = FramingNone
	case hf.chunked:
		r.Framing = FramingChunked
	case hf.hasLength:
		r.Framing, r.ContentLength = FramingLength, hf.contentLength
	default:
		r.Framing = FramingUntilClose
	}
	r.Close = hf.closeToken || (r.Minor == 0 && !hf.keepAliveToken) || r.Framing == FramingUntilClose
	return errNone
}

// parseStatusLine parses "HTTP/1.x SP 3DIGIT [SP reason]" from buf[:end].
func (r *Response) parseStatusLine(buf []byte, end int) errCode {
	line := buf[:end]
	if len(line) < 12 || line[8] != ' ' {
		for _, c := range line {
			if c == '\r' {
				return errBareCR
			}
		}
		if len(line) >= 8 {
			if _, code := parseVersion(line[:8]); code != errNone {
				return code
			}
		}
		return errBadStatusLine
	}
	minor, code := parseVersion(line[:8])
	if code != errNone {
		return code
	}
	r.Minor = minor
	status := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return errBadStatusLine
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 || status > 599 {
		return errBadStatus
	}
	r.Status = status
	reason := 12
	if len(line) > 12 {
		if line[12] != ' ' {
			return errBadStatusLine
		}
		reason = 13
	}
	for _, c := range line[reason:] {
		if !isFieldVchar[c] {
			if c == '\r' {
				return errBareCR
			}
			return errBadStatusLine
		}
	}
	r.Reason = Span{int32(reason), int32(end)}
	return errNone
}
