package http1

import (
	"bytes"
	"strconv"
)

const (
	// maxChunkLine bounds a chunk-size line, CRLF included. net/http
	// fails a line that does not fit its 4 KiB read buffer, so a longer
	// limit would let us accept what a Go backend rejects.
	maxChunkLine = 4096
	// maxTrailer bounds the trailer section, field lines and their CRLFs.
	maxTrailer = 8 << 10
	// maxChunkOverhead is how many bytes of chunk lines beyond an
	// allowance of 16 per chunk plus twice the data a body may hold; the
	// same budget net/http grants, so that a body of a million one-byte
	// chunks with long extensions cannot keep a worker busy for free.
	maxChunkOverhead = 16 << 10
)

// Chunked-body errors. They are 400 for a request body; a caller decoding
// a response body answers 502.
var (
	errChunkSize      = &Error{Status: 400, Reason: "invalid chunk size"}
	errChunkLineLong  = &Error{Status: 400, Reason: "chunk size line too long"}
	errChunkExtension = &Error{Status: 400, Reason: "invalid chunk extension"}
	errChunkDataCRLF  = &Error{Status: 400, Reason: "chunk data not followed by CRLF"}
	errChunkBareLF    = &Error{Status: 400, Reason: "bare LF in chunked body"}
	errChunkBareCR    = &Error{Status: 400, Reason: "bare CR in chunked body"}
	errChunkOverhead  = &Error{Status: 400, Reason: "chunked body with too much non-data"}
	errTrailerTooBig  = &Error{Status: 400, Reason: "trailer section too large"}
	errTrailerField   = &Error{Status: 400, Reason: "invalid trailer field"}
	errChunkedDone    = &Error{Status: 400, Reason: "chunked body already ended"}
)

type chunkedState uint8

const (
	stateSize     chunkedState = iota // expecting a chunk-size line
	stateData                         // inside chunk data
	stateDataCRLF                     // expecting the CRLF after chunk data
	stateTrailer                      // after the last chunk: trailer fields, then CRLF
	stateDone
)

// ChunkedDecoder decodes a chunked body incrementally; the zero value is ready.
type ChunkedDecoder struct {
	state  chunkedState
	remain int64 // bytes of chunk data still to come, in stateData
	excess int64 // chunk-line bytes not yet paid for by data, as net/http counts them
	// trailerChecked is how many bytes of trailer field lines, from the
	// start of the trailer, earlier calls have validated: a trailer sent
	// a byte at a time is not re-read from its start each time.
	trailerChecked int
}

// Reset makes d ready for a new body.
func (d *ChunkedDecoder) Reset() { *d = ChunkedDecoder{} }

// Next decodes from the start of src. n is how many bytes of src it consumed;
// data is payload (a subslice of src) found in them; at the end of the body
// done is true and trailer is the trailer section's field lines with their
// CRLFs (a subslice of src, validated like header fields, empty when none;
// without the final empty line). n == 0 with no error means src holds no
// complete element: read more and call again with the unconsumed bytes at
// the front. Errors are *Error with Status 400 (the caller maps it to 502 for responses).
//
// One call returns the data of at most one chunk, so a caller loops until
// it has consumed what it read.
func (d *ChunkedDecoder) Next(src []byte) (n int, data, trailer []byte, done bool, err error) {
	for {
		switch d.state {
		case stateSize:
			if data != nil {
				return n, data, nil, false, nil
			}
			lineLen, size, err := d.parseSizeLine(src[n:])
			if err != nil {
				return 0, nil, nil, false, err
			}
			if lineLen == 0 {
				return n, nil, nil, false, nil
			}
			n += lineLen
			if size == 0 {
				d.state = stateTrailer
			} else {
				d.state, d.remain = stateData, size
			}
		case stateData:
			avail := int64(len(src) - n)
			if avail == 0 {
				return n, data, nil, false, nil
			}
			take := min(avail, d.remain)
			data = src[n : n+int(take) : n+int(take)]
			n += int(take)
			d.remain -= take
			if d.remain > 0 {
				return n, data, nil, false, nil
			}
			d.state = stateDataCRLF
		case stateDataCRLF:
			rest := src[n:]
			if len(rest) < 2 {
				if len(rest) == 1 && rest[0] != '\r' {
					return 0, nil, nil, false, errChunkDataCRLF
				}
				return n, data, nil, false, nil
			}
			if rest[0] != '\r' || rest[1] != '\n' {
				return 0, nil, nil, false, errChunkDataCRLF
			}
			n += 2
			d.state = stateSize
		case stateTrailer:
			tlen, end, checked, err := scanTrailer(src[n:], d.trailerChecked)
			if err != nil {
				return 0, nil, nil, false, err
			}
			if end == 0 {
				d.trailerChecked = checked
				return n, data, nil, false, nil
			}
			trailer = src[n : n+tlen : n+tlen]
			n += end
			d.state = stateDone
			return n, data, trailer, true, nil
		default:
			return 0, nil, nil, false, errChunkedDone
		}
	}
}

// parseSizeLine parses "chunk-size [chunk-ext] CRLF" at the start of src.
// lineLen is 0 when the line is not complete yet.
func (d *ChunkedDecoder) parseSizeLine(src []byte) (lineLen int, size int64, err error) {
	if len(src) > 0 && !isHex[src[0]] {
		return 0, 0, errChunkSize // fail early on garbage, before its LF
	}
	window := src
	if len(window) > maxChunkLine {
		window = window[:maxChunkLine]
	}
	lf := bytes.IndexByte(window, '\n')
	if lf < 0 {
		if len(src) >= maxChunkLine {
			return 0, 0, errChunkLineLong
		}
		return 0, 0, nil
	}
	if lf == 0 || src[lf-1] != '\r' {
		return 0, 0, errChunkBareLF
	}
	line := src[:lf-1]
	i := 0
	for i < len(line) && isHex[line[i]] {
		if i == 15 { // more than 15 hex digits could overflow an int63
			return 0, 0, errChunkSize
		}
		size = size<<4 | int64(unhex(line[i]))
		i++
	}
	if i < len(line) && line[i] != ';' {
		if line[i] == '\r' {
			return 0, 0, errChunkBareCR
		}
		// This also refuses whitespace before ';', which net/http
		// cannot parse either.
		return 0, 0, errChunkSize
	}
	if err := validChunkExtensions(line[i:]); err != nil {
		return 0, 0, err
	}
	d.excess += int64(len(line)) + 2
	d.excess -= 16 + 2*size
	d.excess = max(d.excess, 0)
	if d.excess > maxChunkOverhead {
		return 0, 0, errChunkOverhead
	}
	return lf + 1, size, nil
}

// validChunkExtensions checks *( ";" BWS name [ BWS "=" BWS value ] BWS )
// where value is a token or a quoted-string (RFC 9112 §7.1.1).
func validChunkExtensions(b []byte) error {
	i := 0
	for i < len(b) {
		if b[i] != ';' {
			if b[i] == '\r' {
				return errChunkBareCR
			}
			return errChunkExtension
		}
		i = skipOWS(b, i+1)
		start := i
		for i < len(b) && isTchar[b[i]] {
			i++
		}
		if i == start {
			return errChunkExtension
		}
		j := skipOWS(b, i)
		if j < len(b) && b[j] == '=' {
			i = skipOWS(b, j+1)
			if i < len(b) && b[i] == '"' {
				end, ok := quotedStringEnd(b, i)
				if !ok {
					return errChunkExtension
				}
				i = end
			} else {
				start := i
				for i < len(b) && isTchar[b[i]] {
					i++
				}
				if i == start {
					return errChunkExtension
				}
			}
			j = skipOWS(b, i)
		}
		// Whitespace is only allowed before another ';', never at the end.
		if j < len(b) && b[j] == ';' {
			i = j
		} else {
			i = j
			if j != len(b) || j > 0 && isOWS(b[j-1]) {
				if j < len(b) && b[j] == '\r' {
					return errChunkBareCR
				}
				return errChunkExtension
			}
		}
	}
	return nil
}

func skipOWS(b []byte, i int) int {
	for i < len(b) && isOWS(b[i]) {
		i++
	}
	return i
}

// quotedStringEnd returns the index just past the quoted-string that starts
// at b[start] (a '"').
func quotedStringEnd(b []byte, start int) (int, bool) {
	for i := start + 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			i++
			if i == len(b) || !isFieldVchar[b[i]] {
				return 0, false
			}
		case !isFieldVchar[c]:
			return 0, false
		}
	}
	return 0, false
}

// scanTrailer finds the end of the trailer section at the start of src:
// tlen is the length of its field lines with their CRLFs, end that plus the
// final CRLF; end is 0 when the section is not complete yet, and then
// checked is how many bytes of whole field lines are valid. The first
// checked bytes were validated by an earlier call.
func scanTrailer(src []byte, checked int) (tlen, end, nowChecked int, err error) {
	pos := checked
	for {
		limit := min(len(src), maxTrailer+2)
		lf := bytes.IndexByte(src[pos:limit], '\n')
		if lf < 0 {
			if len(src) >= maxTrailer+2 {
				return 0, 0, 0, errTrailerTooBig
			}
			if pos < len(src) && isOWS(src[pos]) {
				return 0, 0, 0, errTrailerField // obs-fold: no need to wait for its end
			}
			return 0, 0, pos, nil
		}
		lf += pos
		if lf == pos || src[lf-1] != '\r' {
			return 0, 0, 0, errChunkBareLF
		}
		if lf-1 == pos {
			if pos > maxTrailer {
				return 0, 0, 0, errTrailerTooBig
			}
			return pos, lf + 1, pos, nil
		}
		var f Field
		if code := parseFieldLine(src, pos, lf-1, &f); code != errNone {
			if code == errBareCR {
				return 0, 0, 0, errChunkBareCR
			}
			return 0, 0, 0, errTrailerField
		}
		// A framing or connection field has no business in a trailer
		// (RFC 9110 §6.5.1), and a backend that merges trailers into the
		// header section could be steered by one; the trailer is
		// forwarded as is, so refuse it here.
		if classify(f.Name.Bytes(src)) != kindOther {
			return 0, 0, 0, errTrailerField
		}
		pos = lf + 1
	}
}

// AppendChunkHeader appends "<hex size>\r\n"; the caller appends the data and "\r\n".
func AppendChunkHeader(dst []byte, size int) []byte {
	dst = strconv.AppendUint(dst, uint64(size), 16)
	return append(dst, '\r', '\n')
}

// AppendLastChunk appends "0\r\n", the trailer section as given, and "\r\n".
func AppendLastChunk(dst, trailer []byte) []byte {
	dst = append(dst, '0', '\r', '\n')
	dst = append(dst, trailer...)
	return append(dst, '\r', '\n')
}

// NextTrailerField returns the field line of a trailer section (as
// ChunkedDecoder.Next returned it, validated) that starts at trailer[pos]:
// its name, its value without surrounding whitespace, and where the next
// line starts. ok is false past the last line, or for a line that is not
// a valid field line (a section not from the decoder), which ends the
// walk. It does not allocate.
func NextTrailerField(trailer []byte, pos int) (name, value []byte, next int, ok bool) {
	if pos >= len(trailer) {
		return nil, nil, 0, false
	}
	cr, code := nextLine(trailer, pos, len(trailer))
	if code != errNone || cr == pos {
		return nil, nil, 0, false
	}
	var f Field
	if parseFieldLine(trailer, pos, cr, &f) != errNone {
		return nil, nil, 0, false
	}
	return f.Name.Bytes(trailer), f.Value.Bytes(trailer), cr + 2, true
}
