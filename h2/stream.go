package h2

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Stream is one request/response exchange. Its accessors do not allocate;
// its methods are safe to call from the handler's goroutine while the
// connection's read loop runs. It must not be used after ServeH2 returns:
// Stream objects are pooled and reused.
type Stream struct {
	sc *ServerConn
	id uint32

	// Request head: written by the read loop before dispatch, then fixed.
	method, scheme, authority, path string
	fields                          []hpack.HeaderField
	contentLength                   int64 // -1: absent

	// Guarded by sc.mu.
	trailers     []hpack.HeaderField
	body         []byte // received, not yet read from off
	off          int
	complete     bool  // the whole body was buffered before dispatch
	received     int64 // DATA payload bytes
	connCredited int64 // bytes in body whose connection credit was returned
	recv         recvWindow
	send         sendWindow
	remoteClosed bool // END_STREAM received
	localClosed  bool // END_STREAM sent
	headersSent  bool
	dispatched   bool
	streaming    bool
	running      bool // the handler runs
	handlerDone  bool
	inMap        bool // live in sc.streams
	released     bool
	err          error // why the stream ended abnormally
	done         chan struct{}
	doneClosed   bool
	stallSince   time.Time
}

var streamPool = sync.Pool{New: func() any { return new(Stream) }}

// closedChan is what Done returns for a stream already torn down.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newStream(sc *ServerConn, id uint32) *Stream {
	st := streamPool.Get().(*Stream)
	fields, trailers, body, done := st.fields[:0], st.trailers[:0], st.body[:0], st.done
	if st.doneClosed {
		done = nil
	}
	*st = Stream{
		sc: sc, id: id, fields: fields, trailers: trailers, body: body, done: done,
		contentLength: -1,
		recv:          newRecvWindow(sc.cfg.StreamWindow),
		send:          sendWindow{n: int64(sc.peer.initialWindowSize)},
	}
	return st
}

// dispatchLocked hands st to an idle handler goroutine, or starts one when
// none is idle; their number never exceeds MaxConcurrentStreams.
func (sc *ServerConn) dispatchLocked(st *Stream) {
	if sc.closing {
		return // the stream was torn down with the connection
	}
	st.dispatched = true
	st.running = true
	st.complete = st.remoteClosed && !st.streaming
	if sc.idleWorkers > 0 {
		sc.idleWorkers--
		sc.workCh <- st // never blocks: cap is MaxConcurrentStreams
		return
	}
	go sc.worker(st)
}

func (sc *ServerConn) worker(st *Stream) {
	for st != nil {
		sc.runHandler(st)
		sc.mu.Lock()
		sc.handlerReturnedLocked(st)
		if sc.closing {
			sc.mu.Unlock()
			return
		}
		sc.idleWorkers++
		sc.mu.Unlock()
		st = <-sc.workCh // nil once the connection closed
	}
}

func (sc *ServerConn) runHandler(st *Stream) {
	defer func() {
		if recover() != nil {
			st.Reset(http2.ErrCodeInternal)
		}
	}()
	sc.h.ServeH2(st)
}

func (sc *ServerConn) handlerReturnedLocked(st *Stream) {
	// running stays true until the end: ending the stream below may wait
	// (unlocked) for the writer, and a reset meanwhile must not pool st.
	st.handlerDone = true
	if st.inMap && !sc.closing {
		switch {
		case !st.headersSent:
			sc.resetStreamLocked(st.id, http2.ErrCodeInternal, false)
		case !st.localClosed:
			sc.writeDataLocked(st, nil, true)
		}
		if st.inMap && !st.remoteClosed {
			// The response is complete; stop the client's upload (§8.1).
			sc.resetStreamLocked(st.id, http2.ErrCodeNo, false)
		}
	}
	sc.creditUnreadLocked(st)
	st.running = false
	sc.maybeCloseStreamLocked(st)
	sc.releaseLocked(st)
}

// creditUnreadLocked returns the connection credit of body bytes nobody
// will read.
func (sc *ServerConn) creditUnreadLocked(st *Stream) {
	if unread := int64(len(st.body)-st.off) - st.connCredited; unread > 0 {
		sc.connCreditLocked(int32(unread))
	}
	st.body, st.off, st.connCredited = st.body[:0], 0, 0
}

// maybeCloseStreamLocked forgets a stream closed in both directions.
func (sc *ServerConn) maybeCloseStreamLocked(st *Stream) {
	if st.inMap && st.remoteClosed && st.localClosed {
		delete(sc.streams, st.id)
		st.inMap = false
		sc.releaseLocked(st)
	}
}

// removeStreamLocked forgets a stream torn down by a reset.
func (sc *ServerConn) removeStreamLocked(st *Stream, err error) {
	if !st.inMap {
		return
	}
	delete(sc.streams, st.id)
	st.inMap = false
	st.abortLocked(err)
	if !st.running {
		sc.creditUnreadLocked(st)
	}
	sc.releaseLocked(st)
	sc.cond.Broadcast()
}

func (st *Stream) abortLocked(err error) {
	if st.err == nil {
		st.err = err
	}
	if st.done != nil && !st.doneClosed {
		close(st.done)
	}
	st.doneClosed = true
}

// releaseLocked stops counting st once it is out of the map and its
// handler returned (Rapid Reset: a reset stream counts until then).
func (sc *ServerConn) releaseLocked(st *Stream) {
	if st.inMap || st.running || st.released {
		return
	}
	st.released = true
	sc.inFlight--
	if sc.inFlight == 0 {
		if sc.idleTimer != nil && !sc.closing {
			sc.idleTimer.Reset(sc.cfg.IdleTimeout)
		}
		sc.maybeFinishLocked()
	}
	if cap(st.body) > 64<<10 {
		st.body = nil
	}
	if sc.hdrStream != st {
		st.sc = nil
		streamPool.Put(st)
	}
}

var statusText = func() (t [600]string) {
	for i := 100; i < len(t); i++ {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// lowerName lowercases an HTTP/1-style field name ("Content-Type");
// HTTP/2 requires lowercase (§8.2.1). It allocates only for uppercase.
func lowerName(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

var errHeadersSent = errors.New("h2: response headers already written")

// writeHeadersLocked encodes a HEADERS block (status 0: trailers).
func (sc *ServerConn) writeHeadersLocked(st *Stream, status int, fields []hpack.HeaderField, end bool) error {
	if err := st.writableLocked(); err != nil {
		return err
	}
	sc.encBuf.Reset()
	if status != 0 {
		if st.headersSent {
			return errHeadersSent
		}
		s := ""
		if status >= 100 && status < len(statusText) {
			s = statusText[status]
		} else {
			s = strconv.Itoa(status)
		}
		sc.enc.WriteField(hpack.HeaderField{Name: ":status", Value: s})
		// A 1xx head (100 Continue, 103 Early Hints) precedes the final one.
		st.headersSent = status >= 200
	}
	for _, f := range fields {
		f.Name = lowerName(f.Name)
		switch f.Name {
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			continue // forbidden in HTTP/2 (§8.2.2)
		}
		// A handler's fields may be over its buffers (a proxy's
		// upstream response head, read in place).
		sc.enc.WriteField(sc.encStrings.field(f))
	}
	block := sc.encBuf.Bytes()
	maxFrame := int(sc.peer.maxFrameSize)
	first := true
	for first || len(block) > 0 {
		frag := block[:min(len(block), maxFrame)]
		block = block[len(frag):]
		if first {
			sc.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0})
			sc.creditControlLocked()
			first = false
		} else {
			sc.wfr.WriteContinuation(st.id, len(block) == 0, frag)
		}
	}
	if end && (status == 0 || status >= 200) {
		st.localClosed = true
		sc.wakeWriter()
		sc.maybeCloseStreamLocked(st)
	} else if status != 0 && status < 200 {
		sc.wakeWriter() // an interim response is sent at once
	} else if sc.wb.len() >= flushThreshold {
		sc.wakeWriter()
	}
	return nil
}

func (st *Stream) writableLocked() error {
	switch {
	case st.err != nil:
		return st.err
	case st.sc.closing:
		return ErrStreamClosed
	case st.localClosed:
		return ErrStreamClosed
	}
	return nil
}

// writeDataLocked sends p as DATA, waiting for flow-control credit and for
// room in the write buffer; end sets END_STREAM on the last frame.
func (sc *ServerConn) writeDataLocked(st *Stream, p []byte, end bool) (int, error) {
	written := 0
	for {
		if err := st.writableLocked(); err != nil {
			return written, err
		}
		if len(p) == 0 && end {
			sc.wfr.WriteData(st.id, true, nil)
			st.localClosed = true
			sc.wakeWriter()
			sc.maybeCloseStreamLocked(st)
			return written, nil
		}
		if len(p) == 0 {
			return written, nil
		}
		if sc.wb.len() >= maxWriteBuffered {
			sc.wakeWriter()
			sc.cond.Wait()
			continue
		}
		n := min(int64(len(p)), st.send.available(), sc.send.available(), int64(sc.peer.maxFrameSize))
		if n <= 0 {
			sc.wakeWriter()
			sc.waitStalledLocked(st)
			continue
		}
		st.stallSince = time.Time{}
		last := end && int(n) == len(p)
		sc.wfr.WriteData(st.id, last, p[:n])
		sc.creditControlLocked()
		st.send.take(n)
		sc.send.take(n)
		written += int(n)
		p = p[n:]
		if last {
			st.localClosed = true
			sc.wakeWriter()
			sc.maybeCloseStreamLocked(st)
			return written, nil
		}
		if sc.wb.len() >= flushThreshold {
			sc.wakeWriter()
		}
	}
}

// waitStalledLocked waits for send window; WriteStallTimeout bounds how
// long a stream may wait before the stall timer resets it.
func (sc *ServerConn) waitStalledLocked(st *Stream) {
	if sc.cfg.WriteStallTimeout > 0 && st.stallSince.IsZero() {
		st.stallSince = time.Now()
		if !sc.stallArmed {
			sc.stallArmed = true
			if sc.stallTimer == nil {
				sc.stallTimer = time.AfterFunc(sc.cfg.WriteStallTimeout, sc.checkStalls)
			} else {
				sc.stallTimer.Reset(sc.cfg.WriteStallTimeout)
			}
		}
	}
	sc.cond.Wait()
}

func (sc *ServerConn) checkStalls() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stallArmed = false
	if sc.closing {
		return
	}
	now := time.Now()
	var next time.Duration
	for _, st := range sc.streams {
		if st.stallSince.IsZero() {
			continue
		}
		waited := now.Sub(st.stallSince)
		if waited >= sc.cfg.WriteStallTimeout {
			st.err = ErrStreamStalled
			sc.resetStreamLocked(st.id, http2.ErrCodeCancel, false)
			continue
		}
		if left := sc.cfg.WriteStallTimeout - waited; next == 0 || left < next {
			next = left
		}
	}
	if next > 0 {
		sc.stallArmed = true
		sc.stallTimer.Reset(next)
	}
}

// ID is the stream id.
func (st *Stream) ID() uint32 { return st.id }

// Method is :method ("CONNECT" is passed through: the caller decides).
func (st *Stream) Method() string { return st.method }

// Scheme is :scheme ("" for CONNECT).
func (st *Stream) Scheme() string { return st.scheme }

// Authority is :authority, or "" when the client sent only host (then in
// Fields); when both were present they are equal, case aside.
func (st *Stream) Authority() string { return st.authority }

// Path is :path ("" for CONNECT).
func (st *Stream) Path() string { return st.path }

// ContentLength is the request's content-length, -1 when absent.
func (st *Stream) ContentLength() int64 { return st.contentLength }

// Fields are the regular request header fields, validated: lowercase
// names, no connection-specific fields, te only "trailers", content-length
// consistent with DATA. The slice is the stream's; do not keep it.
func (st *Stream) Fields() []hpack.HeaderField { return st.fields }

// Body is the whole request body when it was buffered before the handler
// ran (complete true; empty for a request without body). Otherwise it
// returns nil, false and the body streams through Read.
func (st *Stream) Body() (buffered []byte, complete bool) {
	if !st.complete {
		return nil, false
	}
	return st.body[st.off:], true
}

// Read reads the request body, returning flow-control credit to the
// client as it is consumed; io.EOF at its end.
func (st *Stream) Read(p []byte) (int, error) {
	sc := st.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for {
		if st.off < len(st.body) {
			n := copy(p, st.body[st.off:])
			st.off += n
			if st.off == len(st.body) {
				st.body, st.off = st.body[:0], 0
			}
			credited := min(int64(n), st.connCredited)
			st.connCredited -= credited
			sc.connCreditLocked(int32(int64(n) - credited))
			sc.streamCreditLocked(st, int32(n))
			return n, nil
		}
		if st.remoteClosed {
			return 0, io.EOF
		}
		if st.err != nil {
			return 0, st.err
		}
		if sc.closing {
			return 0, ErrStreamClosed
		}
		sc.cond.Wait()
	}
}

// Trailers are the request trailers, once the body was read to io.EOF.
func (st *Stream) Trailers() []hpack.HeaderField {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	return st.trailers
}

// WriteHeaders sends the response head: a 1xx interim head (sent at once,
// may repeat) or the final one. Field names are lowercased when needed
// (an allocation, avoided by passing lowercase names); connection-specific
// fields are dropped. endStream ends the response.
func (st *Stream) WriteHeaders(status int, fields []hpack.HeaderField, endStream bool) error {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	return st.sc.writeHeadersLocked(st, status, fields, endStream)
}

// Write sends response body bytes, flow-controlled: it blocks while the
// client's window is closed, and a window closed past WriteStallTimeout
// resets the stream (ErrStreamStalled). Writes are coalesced with other
// streams' frames; Flush, CloseWrite or returning from ServeH2 sends them.
func (st *Stream) Write(p []byte) (int, error) {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	if !st.headersSent {
		return 0, errors.New("h2: Write before WriteHeaders")
	}
	return st.sc.writeDataLocked(st, p, false)
}

// WriteLast sends p as the last bytes of the response: the DATA frame
// that carries them ends the stream (a Write then a CloseWrite would
// take a frame more). Flow-controlled like Write.
func (st *Stream) WriteLast(p []byte) (int, error) {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	if !st.headersSent {
		return 0, errors.New("h2: WriteLast before WriteHeaders")
	}
	return st.sc.writeDataLocked(st, p, true)
}

// Flush asks the connection's writer to send what is queued now.
func (st *Stream) Flush() { st.sc.wakeWriter() }

// CloseWrite ends the response (END_STREAM on an empty DATA frame).
func (st *Stream) CloseWrite() error {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	if st.localClosed && st.err == nil {
		return nil
	}
	_, err := st.sc.writeDataLocked(st, nil, true)
	return err
}

// WriteTrailers ends the response with trailer fields (gRPC's grpc-status
// travels here); WriteHeaders must have been called.
func (st *Stream) WriteTrailers(fields []hpack.HeaderField) error {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	if !st.headersSent {
		return errors.New("h2: WriteTrailers before WriteHeaders")
	}
	return st.sc.writeHeadersLocked(st, 0, fields, true)
}

// Reset aborts the stream with RST_STREAM code.
func (st *Stream) Reset(code http2.ErrCode) {
	sc := st.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if st.inMap {
		sc.resetStreamLocked(st.id, code, false)
	}
	if st.err == nil {
		st.err = ErrStreamClosed
	}
}

// Done is closed when the stream is torn down before its response ended:
// client RST_STREAM, our Reset, GOAWAY teardown or connection close. The
// channel is reused by a later stream when it was not closed, so nothing
// may wait on it after ServeH2 returns.
func (st *Stream) Done() <-chan struct{} {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	if st.doneClosed {
		if st.done != nil {
			return st.done
		}
		return closedChan
	}
	if st.done == nil {
		st.done = make(chan struct{})
	}
	return st.done
}

// Err is why the stream ended abnormally, nil while it is healthy.
func (st *Stream) Err() error {
	st.sc.mu.Lock()
	defer st.sc.mu.Unlock()
	return st.err
}
