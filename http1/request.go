package http1

// Request is a parsed request head. Its spans index the buffer it was
// parsed from and are stale once that buffer is refilled or moved.
type Request struct {
	Method, Target Span
	Minor          uint8 // HTTP/1.<Minor>: 0 or 1
	Fields         [MaxHeaders]Field
	NFields        int
	HeadLen        int     // bytes of buf the head took, final CRLF included
	Framing        Framing // FramingNone, FramingLength or FramingChunked
	ContentLength  int64   // with FramingLength
	Host           Span    // the Host field's value; zero Span when absent (only allowed for HTTP/1.0)
	Close          bool    // the connection must close after this exchange (Connection: close; HTTP/1.0 without keep-alive)
	ExpectContinue bool    // Expect: 100-continue
	Upgrade        Span    // the Upgrade field's value when Connection names "upgrade"; zero otherwise
	Connect        bool    // method CONNECT (authority-form target)
}

// Parse parses a request head from the start of buf into r (every field of
// r is overwritten; r may be reused; entries of Fields past NFields are
// stale). It returns ErrIncomplete when buf does not hold the whole head
// yet and no limit is exceeded, or an *Error whose Status is the answer to
// send before closing the connection.
//
// Parse keeps no state between calls and reads buf from its start, so a
// caller reading a head in small pieces should call it after the first
// read and then again only when the bytes just read hold a '\n' or buf has
// grown to MaxRequestLine+2 or MaxHeadBytes bytes (so the limits are
// enforced before a CRLF arrives): otherwise a client sending a byte at a
// time makes the work quadratic in the head size. With that rule Parse runs at
// most once per line, and MaxHeaders bounds the lines.
func (r *Request) Parse(buf []byte, lim Limits) error {
	lim = lim.withDefaults()
	r.reset()
	if code := r.parse(buf, lim); code != errNone {
		r.reset()
		return code.request()
	}
	return nil
}

// reset zeroes everything but Fields, which NFields bounds: clearing the
// whole array would cost more than the parse of a small request.
func (r *Request) reset() {
	r.Method, r.Target, r.Minor = Span{}, Span{}, 0
	r.NFields, r.HeadLen = 0, 0
	r.Framing, r.ContentLength = FramingNone, 0
	r.Host, r.Upgrade = Span{}, Span{}
	r.Close, r.ExpectContinue, r.Connect = false, false, false
}

func (r *Request) parse(buf []byte, lim Limits) errCode {
	// The request line, bounded by MaxRequestLine even while its CRLF has
	// not arrived, so that a client cannot make us buffer an endless line.
	lineLimit := lim.MaxRequestLine + 2
	cr, code := nextLine(buf, 0, lineLimit)
	if code == errIncomplete {
		switch {
		case len(buf) >= lineLimit:
			return errRequestLineTooLong
		case len(buf) >= lim.MaxHeadBytes:
			return errHeadTooLarge
		}
		// Refuse what cannot become a request line now, not after 8 KiB
		// or a timeout: a TLS handshake sent to a plain-text port, a
		// bare CR.
		return checkRequestLinePrefix(buf)
	}
	if code != errNone {
		return code
	}
	if cr == 0 {
		return errLeadingEmptyLine
	}
	if cr+2 > lim.MaxHeadBytes {
		return errHeadTooLarge
	}
	if code := r.parseRequestLine(buf[:cr]); code != errNone {
		return code
	}

	var kinds [MaxHeaders]fieldKind
	n, headLen, code := parseFieldLines(buf, cr+2, lim.MaxHeadBytes, &r.Fields, &kinds)
	if code != errNone {
		return code
	}
	r.NFields, r.HeadLen = n, headLen
	hf, code := analyzeFields(buf, &r.Fields, &kinds, n, r.Minor, true)
	if code != errNone {
		return code
	}

	switch {
	case r.Connect && (hf.chunked || hf.contentLength > 0):
		// What follows a CONNECT head is the tunnel: a body would make
		// the proxy and the upstream disagree on where it starts.
		return errConnectWithBody
	case hf.chunked:
		r.Framing = FramingChunked
	case hf.hasLength:
		r.Framing, r.ContentLength = FramingLength, hf.contentLength
	default:
		r.Framing = FramingNone
	}
	if hf.hosts == 0 && r.Minor == 1 {
		return errNoHost
	}
	r.Host = hf.host
	if authority := r.absoluteAuthority(buf); authority.Len() > 0 && hf.hosts == 1 &&
		!EqualFoldBytes(authority.Bytes(buf), hf.host.Bytes(buf)) {
		return errHostMismatch
	}
	r.Close = hf.closeToken || (r.Minor == 0 && !hf.keepAliveToken)
	// RFC 9110 §10.1.1: an HTTP/1.0 client cannot be waiting for a 100.
	r.ExpectContinue = hf.expectContinue && r.Minor == 1
	r.Upgrade = hf.upgrade
	return errNone
}

// parseRequestLine parses "method SP target SP HTTP/1.x" (CRLF excluded).
func (r *Request) parseRequestLine(line []byte) errCode {
	i := 0
	for i < len(line) && isTchar[line[i]] {
		i++
	}
	switch {
	case i < len(line) && line[i] == '\r':
		return errBareCR
	case i == 0:
		return errBadMethod
	case i == len(line) || line[i] != ' ':
		return errBadRequestLine
	}
	r.Method = Span{0, int32(i)}
	start := i + 1
	j := start
	for j < len(line) && line[j] != ' ' {
		j++
	}
	if code := checkTarget(line[start:j]); code != errNone {
		return code
	}
	if j == start || j == len(line) {
		return errBadRequestLine
	}
	r.Target = Span{int32(start), int32(j)}
	minor, code := parseVersion(line[j+1:])
	if code != errNone {
		return code
	}
	r.Minor = minor
	return r.checkTargetForm(line)
}

// checkTarget checks the bytes of a request target: visible ASCII but
// '#' and '\' (isTargetChar), and valid percent-encoding in the path.
func checkTarget(target []byte) errCode {
	inQuery := false
	for j, c := range target {
		if !isTargetChar[c] {
			if c == '\r' {
				return errBareCR
			}
			return errBadTarget
		}
		// A bad percent-encoding in the path is refused: it is what
		// routes match, and decoders disagree on it. In the query it is
		// passed on, as net/http and nginx do ("?off=10%" is common).
		if c == '%' && !inQuery && (j+2 >= len(target) || !isHex[target[j+1]] || !isHex[target[j+2]]) {
			return errBadPercent
		}
		inQuery = inQuery || c == '?'
	}
	return errNone
}

// parseVersion parses "HTTP/1.0" or "HTTP/1.1"; another major version is
// 505, anything else 400.
func parseVersion(v []byte) (uint8, errCode) {
	if len(v) != 8 || string(v[:5]) != "HTTP/" || v[6] != '.' ||
		v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		for _, c := range v {
			if c == '\r' {
				return 0, errBareCR
			}
		}
		return 0, errBadVersion
	}
	if v[5] != '1' {
		return 0, errVersionNotSupported
	}
	if v[7] != '0' && v[7] != '1' {
		return 0, errBadVersion
	}
	return v[7] - '0', errNone
}

// checkTargetForm checks that the target's form (RFC 9112 §3.2) fits the
// method: CONNECT takes authority-form and only that, "*" is for OPTIONS,
// everything else is origin-form or absolute-form.
func (r *Request) checkTargetForm(buf []byte) errCode {
	method, target := r.Method.Bytes(buf), r.Target.Bytes(buf)
	r.Connect = string(method) == "CONNECT"
	if r.Connect {
		if !validAuthority(target, true) {
			return errTargetForm
		}
		return errNone
	}
	switch {
	case target[0] == '/':
		return errNone
	case len(target) == 1 && target[0] == '*':
		if string(method) != "OPTIONS" {
			return errTargetForm
		}
		return errNone
	}
	authority, ok := splitAbsoluteForm(target)
	if !ok || !validAuthority(authority, false) {
		return errTargetForm
	}
	return errNone
}

// absoluteAuthority is the authority of an absolute-form target, or a zero Span.
func (r *Request) absoluteAuthority(buf []byte) Span {
	if r.Connect {
		return Span{}
	}
	target := r.Target.Bytes(buf)
	authority, ok := splitAbsoluteForm(target)
	if !ok {
		return Span{}
	}
	start := r.Target.Start + int32(schemeLen(target))
	return Span{start, start + int32(len(authority))}
}

// schemeLen is the length of "http://" or "https://" at the start of
// target, or 0.
func schemeLen(target []byte) int {
	switch {
	case len(target) >= 7 && EqualFold(target[:7], "http://"):
		return 7
	case len(target) >= 8 && EqualFold(target[:8], "https://"):
		return 8
	}
	return 0
}

// splitAbsoluteForm returns the authority of an absolute-form target
// "http://authority[/path][?query]" (scheme http or https, any case).
func splitAbsoluteForm(target []byte) ([]byte, bool) {
	n := schemeLen(target)
	if n == 0 {
		return nil, false
	}
	rest := target[n:]
	end := 0
	for end < len(rest) && rest[end] != '/' && rest[end] != '?' {
		end++
	}
	return rest[:end], true
}

// checkRequestLinePrefix returns errIncomplete when p, a request line
// whose CRLF has not arrived, may still become a valid one, and the error
// it already has otherwise. It checks the shape only; parseRequestLine
// checks the rest once the line is whole.
func checkRequestLinePrefix(p []byte) errCode {
	i := 0
	for i < len(p) && isTchar[p[i]] {
		i++
	}
	if i == len(p) {
		return errIncomplete
	}
	switch {
	case p[i] == '\r' && i > 0:
		return errBareCR
	case i == 0:
		if p[0] == '\r' && len(p) == 1 {
			return errIncomplete // "\r\n" at the start is reported once the LF is here
		}
		if p[0] == '\r' {
			return errBareCR
		}
		return errBadMethod
	case p[i] != ' ':
		return errBadRequestLine
	}
	i++
	for i < len(p) && p[i] != ' ' {
		if !isTargetChar[p[i]] {
			if p[i] == '\r' {
				return errBareCR
			}
			return errBadTarget
		}
		i++
	}
	if i == len(p) {
		return errIncomplete
	}
	// The version: "HTTP/" DIGIT "." DIGIT, then the CR of the CRLF.
	const pattern = "HTTP/d.d\r"
	version := p[i+1:]
	if len(version) > len(pattern) {
		return errBadVersion
	}
	for k, c := range version {
		switch want := pattern[k]; want {
		case 'd':
			if c < '0' || c > '9' {
				return errBadVersion
			}
		default:
			if c != want {
				if c == '\r' {
					return errBareCR
				}
				return errBadVersion
			}
		}
	}
	return errIncomplete
}
