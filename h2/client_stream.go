package h2

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// RequestHead is what OpenStream sends: the pseudo-headers, the regular
// fields (lower-case names, no connection-specific field; the caller
// strips hop-by-hop fields), and optionally a buffered body. The strings
// may be over the caller's buffers: OpenStream copies what it keeps. A
// field Sensitive is never indexed (a per-request value such as a
// request id gains nothing from the table).
type RequestHead struct {
	Method, Scheme, Authority, Path string // CONNECT sends only Method and Authority
	Fields                          []hpack.HeaderField
	// Body, when set, goes out with the HEADERS in the same write, as far
	// as the peer's windows allow; OpenStream writes the rest before it
	// returns (blocking on flow control).
	Body []byte
	// EndStream: the request ends after Body (no Write or trailers follow).
	EndStream bool
	// Informational, when set, receives each 1xx response (103 Early
	// Hints, 100 Continue); it runs on the read loop, fields valid only
	// during the call. Without it 1xx responses are skipped.
	Informational func(status int, fields []hpack.HeaderField)
}

// ClientStream is one request/response exchange on a ClientConn. Call
// Release when done with it: it returns the stream and its buffers to a
// pool (resetting it with CANCEL if it is still open); the fields
// ResponseHead and Trailers returned are valid until then.
type ClientStream struct {
	cc   *ClientConn
	id   uint32
	cond sync.Cond // L = &cc.mu: response progress or the end

	// Guarded by cc.mu.
	inMap           bool
	sendWindow      int32
	recvWindow      int32
	recvUnacked     int32
	sendClosed      bool  // END_STREAM or RST sent (or the stream died)
	sendErr         error // why sending is over, if not by CloseSend
	recvClosed      bool  // END_STREAM received: the response is complete
	discarded       bool  // reset by us: buffered data dropped
	err             error // why the stream died
	gotHead         bool
	headEnded       bool // the final head carried END_STREAM (trailers-only)
	status          int
	fields          []hpack.HeaderField
	trailers        []hpack.HeaderField
	contentLength   int64 // -1: none
	received        int64
	isHead          bool
	noBody          bool
	informational   int
	onInformational func(int, []hpack.HeaderField)
	buf             []byte
	off             int
}

var clientStreamPool = sync.Pool{New: func() any { return new(ClientStream) }}

// clientMaxPooledBuf: a body buffer grown past this is not kept.
const clientMaxPooledBuf = 64 << 10

// clientCheckRequestHead validates h and returns its RFC 9113 header
// list size.
func clientCheckRequestHead(h *RequestHead) (uint64, error) {
	if !clientValidMethod(h.Method) {
		return 0, fmt.Errorf("%w: method %q is not a token", ErrInvalidRequestHead, h.Method)
	}
	if h.Method != "CONNECT" {
		if h.Scheme == "" || h.Path == "" {
			return 0, fmt.Errorf("%w: %s needs :scheme and :path (got %q, %q)", ErrInvalidRequestHead, h.Method, h.Scheme, h.Path)
		}
	} else if h.Authority == "" {
		return 0, fmt.Errorf("%w: CONNECT needs :authority", ErrInvalidRequestHead)
	}
	for _, v := range [...]string{h.Scheme, h.Authority, h.Path} {
		if !clientValidValue(v) {
			return 0, fmt.Errorf("%w: pseudo-header value %q has NUL, CR, LF or surrounding white space", ErrInvalidRequestHead, v)
		}
	}
	for _, f := range h.Fields {
		if len(f.Name) > 0 && f.Name[0] == ':' {
			return 0, fmt.Errorf("%w: pseudo-header %q in Fields (use the RequestHead fields)", ErrInvalidRequestHead, f.Name)
		}
		if err := clientCheckRegularField(f); err != nil {
			return 0, fmt.Errorf("%w: %v", ErrInvalidRequestHead, err)
		}
	}
	size := clientHeaderListSize(h.Fields) + uint64(len(h.Method)+len(h.Scheme)+len(h.Authority)+len(h.Path)) + 4*32
	return size, nil
}

// clientValidMethod: a method is a token (RFC 9110 §9.1), any case.
func clientValidMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if !clientTokenChar[c] {
			return false
		}
	}
	return true
}

// OpenStream opens a stream and sends h: HEADERS (with CONTINUATION as
// needed) and as much of h.Body as the windows allow, in one write. It
// returns a *ClientRefusedError (errors.Is ErrRefused, IsRetrySafe true)
// when the connection cannot take a stream (see CanTakeNewStream):
// nothing was sent, another connection may take the request. It blocks
// only on the socket write and, for a Body larger than the peer's
// windows, on flow control.
func (cc *ClientConn) OpenStream(h *RequestHead) (*ClientStream, error) {
	size, err := clientCheckRequestHead(h)
	if err != nil {
		return nil, err
	}
	cc.wmu.Lock()
	cc.mu.Lock()
	if why := cc.refusalLocked(); why != "" {
		cc.mu.Unlock()
		cc.wmu.Unlock()
		return nil, &ClientRefusedError{Reason: why}
	}
	if cc.peerMaxHeaderList != 0 && size > uint64(cc.peerMaxHeaderList) {
		max := cc.peerMaxHeaderList
		cc.mu.Unlock()
		cc.wmu.Unlock()
		return nil, fmt.Errorf("%w: header list of %d bytes is over the peer's SETTINGS_MAX_HEADER_LIST_SIZE %d", ErrInvalidRequestHead, size, max)
	}
	s := clientStreamPool.Get().(*ClientStream)
	s.cc = cc
	s.cond.L = &cc.mu
	s.id = cc.nextID
	cc.nextID += 2
	s.inMap = true
	s.sendWindow = cc.peerInitialWindow
	s.recvWindow = cc.cfg.streamWindow
	s.contentLength = -1
	s.isHead = h.Method == "HEAD"
	s.onInformational = h.Informational
	cc.streams[s.id] = s
	cc.active++
	tableSize, maxFrame := cc.peerTableSize, int(cc.peerMaxFrame)
	body := h.Body
	taken := 0
	if len(body) > 0 && cc.sendWindow > 0 && s.sendWindow > 0 {
		taken = min(len(body), int(cc.sendWindow), int(s.sendWindow), 256<<10)
		cc.sendWindow -= int32(taken)
		s.sendWindow -= int32(taken)
	}
	endAll := h.EndStream && taken == len(body)
	if endAll {
		s.sendClosed = true
	}
	cc.mu.Unlock()

	if tableSize != cc.encTable {
		// Our encoder's table stays at most 4096 whatever the peer allows.
		cc.henc.SetMaxDynamicTableSizeLimit(tableSize)
		cc.henc.SetMaxDynamicTableSize(min(tableSize, 4096))
		cc.encTable = tableSize
	}
	cc.hbuf.b = cc.hbuf.b[:0]
	cc.writeField(hpack.HeaderField{Name: ":method", Value: h.Method})
	if h.Method != "CONNECT" {
		cc.writeField(hpack.HeaderField{Name: ":scheme", Value: h.Scheme})
	}
	if h.Authority != "" {
		cc.writeField(hpack.HeaderField{Name: ":authority", Value: h.Authority})
	}
	if h.Method != "CONNECT" {
		cc.writeField(hpack.HeaderField{Name: ":path", Value: h.Path})
	}
	for _, f := range h.Fields {
		cc.writeField(f)
	}
	cc.wbuf.b = clientAppendHeaders(cc.wbuf.b, s.id, h.EndStream && len(body) == 0, cc.hbuf.b, maxFrame)
	cc.wbuf.b = clientAppendDataFrames(cc.wbuf.b, s.id, endAll && len(body) > 0, body[:taken], maxFrame)
	err = cc.flushLocked()
	cc.wmu.Unlock()
	if err != nil {
		err = fmt.Errorf("h2 client: writing stream %d to %v: %w", s.id, cc.conn.RemoteAddr(), err)
		cc.fail(err)
		s.Release()
		return nil, err
	}
	if rest := body[taken:]; len(rest) > 0 || (h.EndStream && !endAll) {
		// Errors here reach the caller through ResponseHead and Read: the
		// peer may answer (413, early 200) before taking the whole body.
		if _, err := s.Write(rest); err == nil && h.EndStream {
			s.CloseSend()
		}
	}
	return s, nil
}

// writeField encodes f (wmu held) with strings the encoder may keep
// (fieldInterner): a request head's may be over the caller's buffers.
func (cc *ClientConn) writeField(f hpack.HeaderField) {
	cc.henc.WriteField(cc.interned.field(f))
}

// clientAppendDataFrames appends p as DATA frames of at most maxFrame.
func clientAppendDataFrames(b []byte, id uint32, end bool, p []byte, maxFrame int) []byte {
	for len(p) > 0 {
		n := min(len(p), maxFrame)
		b = clientAppendData(b, id, end && n == len(p), p[:n])
		p = p[n:]
	}
	return b
}

// ID is the stream's id.
func (s *ClientStream) ID() uint32 { return s.id }

// sendStateLocked is why sending is over (nil while it may go on).
func (s *ClientStream) sendStateLocked() error {
	switch {
	case s.sendClosed && s.sendErr != nil:
		return s.sendErr
	case s.sendClosed:
		return ErrSendClosed
	case s.err != nil:
		return s.err
	case s.cc.closed:
		return fmt.Errorf("h2 client: stream %d: %w", s.id, s.cc.err)
	}
	return nil
}

// Write sends request body bytes as DATA, blocking while the peer's
// stream or connection window is closed. It returns an error when the
// stream or connection ended (a *ClientStreamError with Remote set when
// the peer reset it; its response may still be readable).
func (s *ClientStream) Write(p []byte) (int, error) {
	cc := s.cc
	n := 0
	for len(p) > 0 {
		cc.mu.Lock()
		for {
			if err := s.sendStateLocked(); err != nil {
				cc.mu.Unlock()
				return n, err
			}
			if cc.sendWindow > 0 && s.sendWindow > 0 {
				break
			}
			cc.sendCond.Wait()
		}
		m := min(len(p), int(cc.sendWindow), int(s.sendWindow), 256<<10)
		cc.sendWindow -= int32(m)
		s.sendWindow -= int32(m)
		maxFrame := int(cc.peerMaxFrame)
		cc.mu.Unlock()
		cc.wmu.Lock()
		cc.wbuf.b = clientAppendDataFrames(cc.wbuf.b, s.id, false, p[:m], maxFrame)
		err := cc.flushLocked()
		cc.wmu.Unlock()
		if err != nil {
			err = fmt.Errorf("h2 client: writing stream %d to %v: %w", s.id, cc.conn.RemoteAddr(), err)
			cc.fail(err)
			return n, err
		}
		n += m
		p = p[m:]
	}
	return n, nil
}

// CloseSend ends the request (an empty DATA frame with END_STREAM).
func (s *ClientStream) CloseSend() error {
	return s.endSend(nil)
}

// WriteTrailers sends trailers and ends the request. Names must be
// lower case; no pseudo-header.
func (s *ClientStream) WriteTrailers(fields []hpack.HeaderField) error {
	if err := clientCheckTrailers(fields); err != nil {
		return fmt.Errorf("%w: trailers: %v", ErrInvalidRequestHead, err)
	}
	if clientHeaderListSize(fields) == 0 {
		return s.endSend(nil)
	}
	return s.endSend(fields)
}

func (s *ClientStream) endSend(trailers []hpack.HeaderField) error {
	cc := s.cc
	cc.mu.Lock()
	err := s.sendStateLocked()
	maxFrame := int(cc.peerMaxFrame)
	cc.mu.Unlock()
	if err != nil {
		return err
	}
	cc.wmu.Lock()
	if trailers == nil {
		cc.wbuf.b = clientAppendData(cc.wbuf.b, s.id, true, nil)
	} else {
		cc.hbuf.b = cc.hbuf.b[:0]
		for _, f := range trailers {
			cc.writeField(f)
		}
		cc.wbuf.b = clientAppendHeaders(cc.wbuf.b, s.id, true, cc.hbuf.b, maxFrame)
	}
	err = cc.flushLocked()
	cc.wmu.Unlock()
	if err != nil {
		err = fmt.Errorf("h2 client: writing stream %d to %v: %w", s.id, cc.conn.RemoteAddr(), err)
		cc.fail(err)
		return err
	}
	cc.mu.Lock()
	s.sendClosed = true
	if s.recvClosed {
		cc.forgetLocked(s)
	}
	cc.mu.Unlock()
	return nil
}

// ResponseHead blocks until the final response HEADERS arrive (1xx are
// skipped, or given to RequestHead.Informational) and returns the status
// and the regular fields (no pseudo-header), valid until Release. A
// trailers-only response (gRPC errors) is a head with END_STREAM: its
// grpc-status is in these fields and Trailers stays nil. Its error is a
// *ClientStreamError (reset; errors.Is ErrMalformedResponse when the
// response was malformed), a *ClientRefusedError (IsRetrySafe), or the
// connection's end. Reset or Close unblock it.
func (s *ClientStream) ResponseHead() (status int, fields []hpack.HeaderField, err error) {
	cc := s.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for !s.gotHead && s.err == nil {
		s.cond.Wait()
	}
	if !s.gotHead || s.discarded {
		return 0, nil, s.err
	}
	return s.status, s.fields[1:], nil // :status is first (validated)
}

// HeadEndedStream reports whether the final response head carried
// END_STREAM: a response without body or trailers, which a proxy
// forwards as one HEADERS frame (gRPC's trailers-only form). Valid once
// ResponseHead returned.
func (s *ClientStream) HeadEndedStream() bool {
	s.cc.mu.Lock()
	defer s.cc.mu.Unlock()
	return s.headEnded
}

// ContentLength is the response's content-length (-1: none), once
// ResponseHead returned.
func (s *ClientStream) ContentLength() int64 {
	s.cc.mu.Lock()
	defer s.cc.mu.Unlock()
	return s.contentLength
}

// Read reads the response body; it returns io.EOF after the last byte
// of a complete response, then Trailers are available. Window credit
// goes back to the peer as bytes are consumed, so an unread body holds
// at most the stream window. Reset or Close unblock it.
func (s *ClientStream) Read(p []byte) (int, error) {
	cc := s.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for len(s.buf) == s.off {
		switch {
		case s.discarded:
			return 0, s.err
		case s.recvClosed:
			return 0, io.EOF
		case s.err != nil:
			return 0, s.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		s.cond.Wait()
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	if s.off == len(s.buf) {
		s.buf, s.off = s.buf[:0], 0
	}
	cc.creditConnLocked(int32(n))
	if !s.recvClosed && s.inMap {
		s.recvUnacked += int32(n)
		if s.recvUnacked >= cc.cfg.streamWindow/2 {
			cc.ctrl.b = clientAppendWindowUpdate(cc.ctrl.b, s.id, uint32(s.recvUnacked))
			s.recvWindow += s.recvUnacked
			s.recvUnacked = 0
			cc.queueCtrlLocked()
		}
	}
	return n, nil
}

// Trailers are the response trailers (grpc-status lives here), set
// once Read returned io.EOF; nil when there were none. Valid until
// Release.
func (s *ClientStream) Trailers() []hpack.HeaderField {
	s.cc.mu.Lock()
	defer s.cc.mu.Unlock()
	if len(s.trailers) == 0 {
		return nil
	}
	return s.trailers
}

// Reset ends the stream now with RST_STREAM(code) (CANCEL to abandon a
// request, e.g. on a per-try timeout); blocked calls return. Buffered
// response data is dropped. A stream already ended is left alone.
func (s *ClientStream) Reset(code http2.ErrCode) {
	cc := s.cc
	cc.mu.Lock()
	var ce *ClientConnError
	if s.inMap {
		ce = cc.resetLocked(s, code, errors.New("reset by the caller"))
	}
	cc.mu.Unlock()
	if ce != nil {
		cc.failConn(ce.Code, ce.Reason)
	}
}

// Release hands the stream back: resets it with CANCEL if it is still
// open, returns the connection credit of unread data, and pools it. The
// stream and the fields it returned must not be used after.
func (s *ClientStream) Release() {
	cc := s.cc
	if cc == nil {
		return
	}
	s.Reset(http2.ErrCodeCancel)
	cc.mu.Lock()
	if n := len(s.buf) - s.off; n > 0 {
		cc.creditConnLocked(int32(n))
	}
	cc.mu.Unlock()
	buf, fields, trailers := s.buf[:0], s.fields[:0], s.trailers[:0]
	if cap(buf) > clientMaxPooledBuf {
		buf = nil
	}
	clear(fields[:cap(fields)])
	clear(trailers[:cap(trailers)])
	*s = ClientStream{buf: buf, fields: fields, trailers: trailers}
	clientStreamPool.Put(s)
}

// endLocked ends the stream with err: both directions are over, blocked
// callers wake. discard drops buffered response data (our reset).
func (s *ClientStream) endLocked(err error, discard bool) {
	if s.err == nil {
		s.err = err
	}
	if !s.sendClosed {
		s.sendClosed = true
		s.sendErr = err
	}
	if discard {
		if n := len(s.buf) - s.off; n > 0 {
			s.cc.creditConnLocked(int32(n))
		}
		s.buf, s.off = s.buf[:0], 0
		s.discarded = true
	}
	s.cond.Broadcast()
}
