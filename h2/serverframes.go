package h2

import (
	"encoding/binary"
	"io"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// processFrameLocked handles one frame read by the read loop. It returns a
// connection error (*h2ConnError) or nil; stream errors are handled here.
func (sc *ServerConn) processFrameLocked(f http2.Frame) error {
	if !sc.sawSettings {
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			return connErr(http2.ErrCodeProtocol, "first frame is not SETTINGS")
		}
		sc.sawSettings = true
	}
	if err := sc.chargeControlLocked(f); err != nil {
		return err
	}
	switch f := f.(type) {
	case *http2.ContinuationFrame:
		return sc.onContinuation(f)
	case *http2.DataFrame:
		return sc.onData(f)
	case *http2.WindowUpdateFrame:
		return sc.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return sc.onRSTStream(f)
	case *http2.SettingsFrame:
		return sc.onSettings(f)
	case *http2.PingFrame:
		return sc.onPing(f)
	case *http2.GoAwayFrame:
		// The client opens no more streams; finish the ones it has.
		sc.finalGoAwayLocked()
		return nil
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			sc.resetStreamLocked(f.StreamID, http2.ErrCodeProtocol, true)
		}
		return nil
	case *http2.PushPromiseFrame:
		return connErr(http2.ErrCodeProtocol, "PUSH_PROMISE from a client")
	}
	return nil // unknown frame types are ignored (§5.5)
}

// headersFrame is a HEADERS frame parsed in place: x/net's Framer
// allocates a HeadersFrame per frame, the one allocation per request left.
type headersFrame struct {
	http2.FrameHeader
	hasPriority bool
	streamDep   uint32
	frag        []byte
}

func (f *headersFrame) StreamEnded() bool  { return f.Flags.Has(http2.FlagHeadersEndStream) }
func (f *headersFrame) HeadersEnded() bool { return f.Flags.Has(http2.FlagHeadersEndHeaders) }

// readFrame reads the next frame: HEADERS into sc.hdrFrame (returned as
// hf), any other through the Framer, which also checks frame sizes and the
// HEADERS/CONTINUATION order for both.
func (sc *ServerConn) readFrame() (f http2.Frame, hf *headersFrame, err error) {
	fh, err := sc.rfr.ReadFrameHeader()
	if err != nil {
		return nil, nil, err
	}
	if fh.Type != http2.FrameHeaders {
		f, err = sc.rfr.ReadFrameForHeader(fh)
		return f, nil, err
	}
	p := sc.hdrPayload[:fh.Length]
	if _, err := io.ReadFull(sc.br, p); err != nil {
		return nil, nil, err
	}
	hf = &sc.hdrFrame
	*hf = headersFrame{FrameHeader: fh}
	if fh.StreamID == 0 {
		return nil, nil, http2.ConnectionError(http2.ErrCodeProtocol)
	}
	pad := 0
	if fh.Flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return nil, nil, http2.ConnectionError(http2.ErrCodeFrameSize)
		}
		pad, p = int(p[0]), p[1:]
	}
	if fh.Flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return nil, nil, http2.ConnectionError(http2.ErrCodeFrameSize)
		}
		hf.hasPriority = true
		hf.streamDep = binary.BigEndian.Uint32(p) & (1<<31 - 1)
		p = p[5:]
	}
	if pad > len(p) {
		// RFC 9113 §6.2: padding as long as the payload or longer.
		return nil, nil, http2.ConnectionError(http2.ErrCodeProtocol)
	}
	hf.frag = p[:len(p)-pad]
	return nil, hf, nil
}

func (sc *ServerConn) processHeadersLocked(f *headersFrame) error {
	if !sc.sawSettings {
		return connErr(http2.ErrCodeProtocol, "first frame is not SETTINGS")
	}
	return sc.onHeaders(f)
}

func (sc *ServerConn) onHeaders(f *headersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return connErr(http2.ErrCodeProtocol, "HEADERS on an even stream id")
	}
	sc.hdrStream, sc.hdrTrailer, sc.hdrBytes = nil, false, 0
	st := sc.streams[id]
	var streamErr http2.ErrCode = 0xffffffff // none
	switch {
	case st != nil && st.remoteClosed:
		streamErr = http2.ErrCodeStreamClosed
	case st != nil:
		// Trailers: must end the stream (§8.1).
		if !f.StreamEnded() {
			streamErr = http2.ErrCodeProtocol
		} else {
			sc.hdrStream, sc.hdrTrailer = st, true
			sc.chk.reset(blockTrailers, sc.cfg.MaxHeaderListSize, st.trailers)
		}
	case id <= sc.maxClientID:
		return connErr(http2.ErrCodeStreamClosed, "HEADERS on a closed stream")
	default:
		sc.maxClientID = id
		switch {
		case sc.finalGoAway && id > sc.lastStreamID:
			// Past our GOAWAY: decode (HPACK state) and drop.
		case f.hasPriority && f.streamDep == id:
			streamErr = http2.ErrCodeProtocol
		case sc.inFlight >= int(sc.cfg.MaxConcurrentStreams):
			streamErr = http2.ErrCodeRefusedStream
		default:
			st = newStream(sc, id)
			sc.hdrStream = st
			sc.chk.reset(blockRequest, sc.cfg.MaxHeaderListSize, st.fields)
			if f.StreamEnded() {
				st.remoteClosed = true
			}
		}
	}
	if err := sc.decodeFragment(f.frag); err != nil {
		return err
	}
	if streamErr != 0xffffffff {
		sc.resetStreamLocked(id, streamErr, true)
	}
	if f.HeadersEnded() {
		return sc.endHeaderBlock()
	}
	sc.hdrLive = true
	return nil
}

func (sc *ServerConn) onContinuation(f *http2.ContinuationFrame) error {
	frag := f.HeaderBlockFragment()
	if len(frag) == 0 && !f.HeadersEnded() && !sc.empties.take(time.Now()) {
		sc.floodLocked("empty-frames")
		return connErr(http2.ErrCodeEnhanceYourCalm, "flood of empty CONTINUATION frames")
	}
	if err := sc.decodeFragment(frag); err != nil {
		return err
	}
	if f.HeadersEnded() {
		return sc.endHeaderBlock()
	}
	return nil
}

// decodeFragment feeds HPACK, bounding the encoded block (CVE-2023-45288).
func (sc *ServerConn) decodeFragment(frag []byte) error {
	sc.hdrBytes += len(frag)
	if sc.hdrBytes > sc.cfg.MaxHeaderBlockBytes {
		sc.floodLocked("header-block")
		return connErr(http2.ErrCodeProtocol, "header block larger than MaxHeaderBlockBytes")
	}
	if _, err := sc.dec.Write(frag); err != nil {
		return connErr(http2.ErrCodeCompression, "HPACK: "+err.Error())
	}
	return nil
}

// emitField is the HPACK decoder's callback.
func (sc *ServerConn) emitField(f hpack.HeaderField) {
	if sc.hdrStream != nil {
		sc.chk.add(f)
	}
}

func (sc *ServerConn) endHeaderBlock() error {
	sc.hdrLive = false
	if err := sc.dec.Close(); err != nil {
		return connErr(http2.ErrCodeCompression, "HPACK: "+err.Error())
	}
	st := sc.hdrStream
	sc.hdrStream = nil
	if st == nil {
		return nil
	}
	err := sc.chk.finish()
	if sc.hdrTrailer {
		st.trailers = sc.chk.fields
		if err != nil {
			sc.resetStreamLocked(st.id, http2.ErrCodeProtocol, true)
			return nil
		}
		return sc.endOfBodyLocked(st)
	}
	st.fields = sc.chk.fields
	switch {
	case err == errHeaderListTooBig:
		// The 431-equivalent: answer it ourselves, the handler never runs.
		sc.addStreamLocked(st)
		st.handlerDone = true
		sc.writeHeadersLocked(st, 431, nil, true)
		if !st.remoteClosed {
			sc.resetStreamLocked(st.id, http2.ErrCodeNo, false)
		} else {
			sc.maybeCloseStreamLocked(st)
		}
		return nil
	case err != nil:
		sc.addStreamLocked(st)
		st.handlerDone = true
		sc.resetStreamLocked(st.id, http2.ErrCodeProtocol, true)
		return nil
	}
	c := &sc.chk
	st.method, st.scheme, st.authority, st.path = c.method, c.scheme, c.authority, c.path
	st.contentLength = c.contentLength
	if st.remoteClosed && st.contentLength > 0 {
		st.fields = c.fields
		sc.addStreamLocked(st)
		st.handlerDone = true
		sc.resetStreamLocked(st.id, http2.ErrCodeProtocol, true)
		return nil
	}
	sc.addStreamLocked(st)
	if st.id == maxWindow && !sc.finalGoAway {
		// Stream ids are exhausted: nothing can follow this stream.
		sc.finalGoAway = true
		sc.lastStreamID = st.id
		sc.goAwayLocked(st.id, http2.ErrCodeNo, "stream ids exhausted")
	}
	switch {
	case st.remoteClosed:
		sc.dispatchLocked(st)
	case st.method == "CONNECT" || st.contentLength > int64(sc.cfg.MaxRequestBodyBuffer):
		st.streaming = true
		sc.dispatchLocked(st)
	case st.contentLength < 0:
		// No length: a streaming protocol (gRPC) may wait for our answer
		// before sending more, so the body is buffered only if it ends
		// within what was already read; see dispatchPendingLocked.
		sc.pendingDispatch = append(sc.pendingDispatch, pendingStream{st, st.id})
	}
	return nil
}

// addStreamLocked makes st live: in the map and counted in flight.
func (sc *ServerConn) addStreamLocked(st *Stream) {
	sc.streams[st.id] = st
	st.inMap = true
	sc.inFlight++
}

func (sc *ServerConn) onData(f *http2.DataFrame) error {
	id := f.StreamID
	n := int32(f.Length)
	data := f.Data()
	if !sc.recv.receive(n) {
		return connErr(http2.ErrCodeFlowControl, "DATA beyond the connection window")
	}
	st := sc.streams[id]
	if st == nil || st.remoteClosed {
		if st == nil && id > sc.maxClientID {
			return connErr(http2.ErrCodeProtocol, "DATA on an idle stream")
		}
		sc.connCreditLocked(n)
		sc.resetStreamLocked(id, http2.ErrCodeStreamClosed, true)
		return nil
	}
	if !st.recv.receive(n) {
		sc.connCreditLocked(n)
		sc.resetStreamLocked(id, http2.ErrCodeFlowControl, true)
		return nil
	}
	if len(data) == 0 && !f.StreamEnded() && !sc.empties.take(time.Now()) {
		sc.floodLocked("empty-frames")
		return connErr(http2.ErrCodeEnhanceYourCalm, "flood of empty DATA frames")
	}
	if pad := n - int32(len(data)); pad > 0 {
		// Padding is consumed at once.
		sc.connCreditLocked(pad)
		sc.streamCreditLocked(st, pad)
	}
	st.received += int64(len(data))
	if st.contentLength >= 0 && st.received > st.contentLength {
		sc.connCreditLocked(int32(len(data)))
		sc.resetStreamLocked(id, http2.ErrCodeProtocol, true)
		return nil
	}
	if st.dispatched && st.handlerDone {
		// Nobody will read it.
		sc.connCreditLocked(int32(len(data)))
	} else {
		st.body = append(st.body, data...)
		if !st.dispatched || !st.streaming {
			// Buffered before dispatch: bounded by MaxRequestBodyBuffer,
			// so the connection window is not held for it.
			sc.connCreditLocked(int32(len(data)))
			st.connCredited += int64(len(data))
		}
	}
	if f.StreamEnded() {
		return sc.endOfBodyLocked(st)
	}
	if !st.dispatched && len(st.body) > sc.cfg.MaxRequestBodyBuffer {
		st.streaming = true
		sc.dispatchLocked(st)
	}
	if st.dispatched {
		sc.cond.Broadcast()
	}
	return nil
}

// endOfBodyLocked: END_STREAM arrived (on DATA or trailers).
func (sc *ServerConn) endOfBodyLocked(st *Stream) error {
	if st.contentLength >= 0 && st.received != st.contentLength {
		sc.resetStreamLocked(st.id, http2.ErrCodeProtocol, true)
		return nil
	}
	st.remoteClosed = true
	if !st.dispatched {
		sc.dispatchLocked(st)
	} else {
		sc.cond.Broadcast()
		sc.maybeCloseStreamLocked(st)
	}
	return nil
}

func (sc *ServerConn) connCreditLocked(n int32) {
	if n <= 0 {
		return
	}
	if inc := sc.recv.release(n); inc > 0 {
		sc.wfr.WriteWindowUpdate(0, uint32(inc))
		sc.wakeWriter()
	}
}

func (sc *ServerConn) streamCreditLocked(st *Stream, n int32) {
	if n <= 0 {
		return
	}
	if inc := st.recv.release(n); inc > 0 && !st.remoteClosed && st.inMap {
		sc.wfr.WriteWindowUpdate(st.id, uint32(inc))
		sc.wakeWriter()
	}
}

func (sc *ServerConn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	if f.StreamID == 0 {
		if !sc.send.add(int64(f.Increment)) {
			return connErr(http2.ErrCodeFlowControl, "connection window past 2^31-1")
		}
		sc.cond.Broadcast()
		return nil
	}
	st := sc.streams[f.StreamID]
	if st == nil {
		if f.StreamID > sc.maxClientID {
			return connErr(http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream")
		}
		return nil
	}
	if !st.send.add(int64(f.Increment)) {
		sc.resetStreamLocked(st.id, http2.ErrCodeFlowControl, true)
		return nil
	}
	sc.cond.Broadcast()
	return nil
}

func (sc *ServerConn) onRSTStream(f *http2.RSTStreamFrame) error {
	if f.StreamID > sc.maxClientID {
		return connErr(http2.ErrCodeProtocol, "RST_STREAM on an idle stream")
	}
	if st := sc.streams[f.StreamID]; st != nil {
		sc.removeStreamLocked(st, ErrStreamClosed)
		if ev := sc.cfg.Events.StreamReset; ev != nil {
			ev(f.ErrCode, true)
		}
	}
	sc.checkResetBudgetLocked()
	return nil
}

// checkResetBudgetLocked spends one reset token (Rapid Reset, CVE-2023-44487).
func (sc *ServerConn) checkResetBudgetLocked() {
	if sc.closing || sc.resets.take(time.Now()) {
		return
	}
	sc.floodLocked("reset")
	sc.connErrorLocked(connErr(http2.ErrCodeEnhanceYourCalm, "too many stream resets"))
}

func (sc *ServerConn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var err error
	f.ForeachSetting(func(s http2.Setting) error {
		delta, e := sc.peer.apply(s)
		if e != nil {
			err = connErr(http2.ErrCode(e.(http2.ConnectionError)), "invalid SETTINGS value")
			return e
		}
		switch s.ID {
		case http2.SettingHeaderTableSize:
			sc.enc.SetMaxDynamicTableSizeLimit(min(s.Val, 4096))
		case http2.SettingInitialWindowSize:
			for _, st := range sc.streams {
				if !st.send.add(delta) {
					err = connErr(http2.ErrCodeFlowControl, "stream window past 2^31-1 after SETTINGS_INITIAL_WINDOW_SIZE")
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	sc.wfr.WriteSettingsAck()
	sc.cond.Broadcast()
	return sc.queueControlLocked()
}

func (sc *ServerConn) onPing(f *http2.PingFrame) error {
	if f.IsAck() {
		if f.Data == shutdownPing && sc.shuttingDown {
			if sc.shutTimer != nil {
				sc.shutTimer.Stop()
			}
			sc.finalGoAwayLocked()
		}
		return nil
	}
	sc.wfr.WritePing(true, f.Data)
	return sc.queueControlLocked()
}

// resetStreamLocked sends RST_STREAM and forgets the stream. byPeer: the
// client's behaviour caused it (it counts in Events as the peer's).
func (sc *ServerConn) resetStreamLocked(id uint32, code http2.ErrCode, causedByPeer bool) {
	if sc.closing {
		return
	}
	sc.wfr.WriteRSTStream(id, code)
	if ev := sc.cfg.Events.StreamReset; ev != nil {
		ev(code, false)
	}
	if st := sc.streams[id]; st != nil {
		sc.removeStreamLocked(st, ErrStreamClosed)
	}
	if causedByPeer {
		if err := sc.queueControlLocked(); err != nil {
			sc.connErrorLocked(err)
			return
		}
		sc.checkResetBudgetLocked()
		return
	}
	sc.wakeWriter()
}

// dispatchPendingLocked starts, streaming, the handlers of requests whose
// body did not end within the bytes read so far: the read loop is about
// to block, and waiting for more could deadlock a bidirectional stream.
func (sc *ServerConn) dispatchPendingLocked() {
	for i, p := range sc.pendingDispatch {
		// A stream reset meanwhile went back to the pool, maybe to another
		// connection: only the map says whether p.st is still ours.
		if st := sc.streams[p.id]; st == p.st && !st.dispatched {
			st.streaming = true
			sc.dispatchLocked(st)
		}
		sc.pendingDispatch[i] = pendingStream{}
	}
	sc.pendingDispatch = sc.pendingDispatch[:0]
}

type pendingStream struct {
	st *Stream
	id uint32
}
