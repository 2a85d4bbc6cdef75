package h2

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Client defaults: the zero ClientConfig means these.
const (
	// DefaultClientStreamWindow bounds what one response body the caller
	// does not read may hold in memory.
	DefaultClientStreamWindow int32 = 256 << 10
	// DefaultClientConnWindow bounds the unread bodies of all streams of
	// one connection together.
	DefaultClientConnWindow int32 = 1 << 20
	// DefaultClientMaxFrameSize is the largest frame we accept (RFC 9113
	// initial value).
	DefaultClientMaxFrameSize uint32 = 16384
	// DefaultClientMaxHeaderListSize bounds a decoded response header or
	// trailer list (RFC 9113 §6.5.2 size: name + value + 32 per field).
	DefaultClientMaxHeaderListSize uint32 = 64 << 10
	// DefaultClientHeaderTableSize is our HPACK decoder's dynamic table.
	DefaultClientHeaderTableSize uint32 = 4096
	// DefaultClientPingTimeout is how long a health PING may stay
	// unanswered.
	DefaultClientPingTimeout = 15 * time.Second
)

const (
	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// clientMaxStreamID: the last odd id we use; past it the connection
	// takes no new stream and closes once drained.
	clientMaxStreamID = 1<<31 - 1
	// clientInitialMaxStreams: the peer's limit assumed until its
	// SETTINGS arrive, and clientDefaultMaxStreams when its SETTINGS do
	// not name one (RFC 9113 says unlimited; we do not believe it).
	clientInitialMaxStreams = 100
	clientDefaultMaxStreams = 1000
	// clientMaxQueuedControlFrames bounds the replies (SETTINGS ACK, PING
	// ACK, RST_STREAM, WINDOW_UPDATE) waiting to be written: a peer that
	// floods PING or SETTINGS while not reading gets ENHANCE_YOUR_CALM,
	// exactly as x/net's server bounds a client.
	clientMaxQueuedControlFrames = 10000
	// clientMaxInformational bounds 1xx responses per stream.
	clientMaxInformational = 8
	// clientInitialWindow is RFC 9113's initial flow-control window.
	clientInitialWindow = 65535
)

// ClientConfig configures one client connection. Its zero value is the
// default (the Default* constants).
type ClientConfig struct {
	// StreamWindow and ConnWindow are our receive windows: a response
	// body the caller does not read holds at most StreamWindow bytes,
	// all bodies of the connection at most ConnWindow. Credit is given
	// back as Read consumes. At least 65535 when set.
	StreamWindow, ConnWindow int32
	// MaxFrameSize is the largest frame we accept (16384..16777215).
	MaxFrameSize uint32
	// MaxHeaderListSize, advertised to the peer, bounds a decoded
	// response header or trailer list; a larger one is a malformed
	// response.
	MaxHeaderListSize uint32
	// HeaderTableSize is our HPACK decoder's dynamic table size.
	HeaderTableSize uint32
	// MaxResponseHeaderBytes bounds the compressed header block (HEADERS
	// plus CONTINUATION payloads) of one response; past it the
	// connection is closed with ENHANCE_YOUR_CALM (CONTINUATION flood,
	// CVE-2023-45288). Default: MaxHeaderListSize.
	MaxResponseHeaderBytes int
	// ReadIdleTimeout: when no frame arrived for this long, send a health
	// PING. 0 sends none (gRPC servers punish idle pings by default).
	ReadIdleTimeout time.Duration
	// PingTimeout: a health PING unanswered this long kills the
	// connection with ErrPingTimeout.
	PingTimeout time.Duration
	// IdleTimeout: a connection without streams for this long closes.
	// 0 keeps it.
	IdleTimeout time.Duration
	// Events are optional callbacks for stats.
	Events ClientEvents
}

// ClientEvents are optional callbacks, called on the connection's read
// loop (or the goroutine that closes it) with no lock held. They must
// not block and must not call back into the connection synchronously.
type ClientEvents struct {
	// GoAway: the peer sent GOAWAY. debug is valid only during the call.
	GoAway func(code http2.ErrCode, lastStreamID uint32, debug []byte)
	// StreamReset: a stream was reset, by the peer (remote) or by us.
	// For our resets it runs with the connection's lock held: count, do
	// not call into the connection.
	StreamReset func(streamID uint32, code http2.ErrCode, remote bool)
	// Dead: the connection is closed, once, with the reason
	// (ErrClientConnClosed for an orderly close).
	Dead func(err error)
}

// clientSettings is a ClientConfig with its defaults resolved.
type clientSettings struct {
	streamWindow, connWindow                         int32
	maxFrameSize, maxHeaderListSize, headerTableSize uint32
	maxHeaderBytes                                   int
	maxHeaderFrames                                  int
	readIdle, pingTimeout, idleTimeout               time.Duration
}

func clientResolve(cfg *ClientConfig) (clientSettings, error) {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	s := clientSettings{
		streamWindow: c.StreamWindow, connWindow: c.ConnWindow,
		maxFrameSize: c.MaxFrameSize, maxHeaderListSize: c.MaxHeaderListSize,
		headerTableSize: c.HeaderTableSize, maxHeaderBytes: c.MaxResponseHeaderBytes,
		readIdle: c.ReadIdleTimeout, pingTimeout: c.PingTimeout, idleTimeout: c.IdleTimeout,
	}
	if s.streamWindow == 0 {
		s.streamWindow = DefaultClientStreamWindow
	}
	if s.connWindow == 0 {
		s.connWindow = DefaultClientConnWindow
	}
	if s.streamWindow < clientInitialWindow {
		return s, fmt.Errorf("h2 client: ClientConfig.StreamWindow %d is below 65535, the RFC 9113 initial window (use 0 for the default %d)", s.streamWindow, DefaultClientStreamWindow)
	}
	if s.connWindow < clientInitialWindow {
		return s, fmt.Errorf("h2 client: ClientConfig.ConnWindow %d is below 65535, the RFC 9113 initial window (use 0 for the default %d)", s.connWindow, DefaultClientConnWindow)
	}
	if s.maxFrameSize == 0 {
		s.maxFrameSize = DefaultClientMaxFrameSize
	}
	if s.maxFrameSize < 16384 || s.maxFrameSize > 1<<24-1 {
		return s, fmt.Errorf("h2 client: ClientConfig.MaxFrameSize %d is outside 16384..16777215 (RFC 9113 §6.5.2; use 0 for the default)", s.maxFrameSize)
	}
	if s.maxHeaderListSize == 0 {
		s.maxHeaderListSize = DefaultClientMaxHeaderListSize
	}
	if s.headerTableSize == 0 {
		s.headerTableSize = DefaultClientHeaderTableSize
	}
	if s.maxHeaderBytes == 0 {
		s.maxHeaderBytes = int(min(s.maxHeaderListSize, math.MaxInt32))
	}
	if s.maxHeaderBytes < 0 {
		return s, fmt.Errorf("h2 client: ClientConfig.MaxResponseHeaderBytes %d is negative (use 0 for the default)", s.maxHeaderBytes)
	}
	// A peer splits a block at its frame size (at least 16384), so a
	// legitimate block needs few frames; empty CONTINUATION frames
	// beyond this are a flood.
	s.maxHeaderFrames = 8 + s.maxHeaderBytes/4096
	if s.pingTimeout == 0 {
		s.pingTimeout = DefaultClientPingTimeout
	}
	if s.readIdle < 0 || s.pingTimeout < 0 || s.idleTimeout < 0 {
		return s, fmt.Errorf("h2 client: ClientConfig timeouts must not be negative (ReadIdleTimeout %v, PingTimeout %v, IdleTimeout %v)", s.readIdle, s.pingTimeout, s.idleTimeout)
	}
	return s, nil
}

// clientBuf is an append-only byte buffer the frame writers fill.
type clientBuf struct{ b []byte }

// ClientConn is one HTTP/2 client connection (RFC 9113) multiplexing
// streams over a net.Conn the caller dialled (h2c prior knowledge, or
// TLS with ALPN "h2" already negotiated).
//
// Goroutines: one read loop and one control writer per connection,
// none per stream. All methods are safe for concurrent use; a
// ClientStream's sending methods (Write, WriteTrailers, CloseSend) are
// for one goroutine and its receiving methods (ResponseHead, Read,
// Trailers) for one, possibly another; Reset for any.
//
// Locking: wmu serialises writes to the socket and the HPACK encoder
// (stream ids go out in increasing order under it); mu guards the
// connection and stream state and is taken after wmu, never before.
// The read loop never takes wmu: its replies go through the control
// queue, flushed by the control writer or by the next request write.
type ClientConn struct {
	conn   net.Conn
	cfg    clientSettings
	events ClientEvents

	// Read loop only.
	br        *bufio.Reader
	fr        *http2.Framer
	hdec      *hpack.Decoder
	hdr       clientHeaderBlock
	rbuf      []byte // payload of the frame being parsed
	gotFirst  bool   // the peer's first frame (its SETTINGS) arrived
	framesIn  atomic.Uint64
	wakeCtrl  chan struct{} // cap 1: control queue not empty
	done      chan struct{}
	closeOnce sync.Once

	wmu      sync.Mutex // guards below and socket writes
	wbuf     clientBuf
	wtmp     []byte
	hbuf     clientBuf
	henc     *hpack.Encoder
	encTable uint32        // the peer's HEADER_TABLE_SIZE applied to henc
	interned fieldInterner // the strings henc may keep (writeField)

	mu       sync.Mutex // guards everything below
	sendCond sync.Cond  // L = &mu: a send window grew, or a stream/the conn ended
	streams  map[uint32]*ClientStream
	nextID   uint32 // next stream id to open
	active   int    // streams in the map
	// the peer's settings
	peerMaxStreams    uint32
	peerInitialWindow int32
	peerMaxFrame      uint32
	peerMaxHeaderList uint32 // 0: unlimited
	peerTableSize     uint32
	// connection flow control
	sendWindow  int32 // what we may still send
	recvWindow  int32 // what the peer may still send
	recvUnacked int32 // consumed, credit not yet returned
	// lifecycle
	goAway      bool
	goAwayLast  uint32
	goAwayCode  http2.ErrCode
	shutdown    bool  // Shutdown called: no new streams
	closing     bool  // GOAWAY queued, close after the next flush
	closed      bool  // dead
	dying       error // the reason of a close in progress (GOAWAY being written)
	err         error // why closed
	idleSince   time.Time
	idleTimer   *time.Timer
	healthTimer *time.Timer
	pingTimer   *time.Timer
	pingOut     bool   // a health PING is unanswered
	pingData    uint64 // its payload
	healthSeen  uint64 // framesIn at the last health check
	// the control queue: frames encoded, not yet written
	ctrl       clientBuf
	ctrlFrames int
}

// clientHeaderBlock is the header block being decoded (read loop only).
type clientHeaderBlock struct {
	streamID  uint32
	endStream bool
	bytes     int // compressed bytes so far
	frames    int
	size      uint64 // decoded RFC size so far
	tooLarge  bool
	fields    []hpack.HeaderField
}

// NewClientConn starts an HTTP/2 client connection on c: it writes the
// connection preface, our SETTINGS and the connection window update
// (one write), then starts the read loop. It does not wait for the
// peer's SETTINGS; until they arrive at most 100 streams may open.
// Close releases c.
func NewClientConn(c net.Conn, cfg *ClientConfig) (*ClientConn, error) {
	s, err := clientResolve(cfg)
	if err != nil {
		return nil, err
	}
	cc := &ClientConn{
		conn:              c,
		cfg:               s,
		br:                bufio.NewReaderSize(c, 32<<10),
		wakeCtrl:          make(chan struct{}, 1),
		done:              make(chan struct{}),
		streams:           make(map[uint32]*ClientStream),
		nextID:            1,
		peerMaxStreams:    clientInitialMaxStreams,
		peerInitialWindow: clientInitialWindow,
		peerMaxFrame:      16384,
		peerTableSize:     4096,
		encTable:          4096,
		sendWindow:        clientInitialWindow,
		recvWindow:        s.connWindow,
		idleSince:         time.Now(),
	}
	if cfg != nil {
		cc.events = cfg.Events
	}
	cc.sendCond.L = &cc.mu
	cc.fr = http2.NewFramer(nil, cc.br)
	cc.fr.SetMaxReadFrameSize(s.maxFrameSize)
	cc.fr.SetReuseFrames()
	// Until our SETTINGS are acknowledged the peer may use the default
	// table size; we shrink to ours on the ACK.
	cc.hdec = hpack.NewDecoder(4096, cc.onHeaderField)
	cc.hdec.SetMaxStringLength(int(min(s.maxHeaderListSize, math.MaxInt32)))
	cc.henc = hpack.NewEncoder(&cc.hbuf)

	b := append(cc.wbuf.b[:0], clientPreface...)
	b = clientAppendSettings(b, []http2.Setting{
		{ID: http2.SettingEnablePush, Val: 0},
		{ID: http2.SettingMaxConcurrentStreams, Val: 0}, // no pushed streams
		{ID: http2.SettingInitialWindowSize, Val: uint32(s.streamWindow)},
		{ID: http2.SettingMaxFrameSize, Val: s.maxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: s.maxHeaderListSize},
		{ID: http2.SettingHeaderTableSize, Val: s.headerTableSize},
	})
	if d := s.connWindow - clientInitialWindow; d > 0 {
		b = clientAppendWindowUpdate(b, 0, uint32(d))
	}
	cc.wbuf.b = b[:0]
	if _, err := c.Write(b); err != nil {
		return nil, fmt.Errorf("h2 client: writing the connection preface to %v: %w", c.RemoteAddr(), err)
	}
	if s.idleTimeout > 0 {
		cc.idleTimer = time.AfterFunc(s.idleTimeout, cc.onIdleTimer)
	}
	if s.readIdle > 0 {
		cc.healthTimer = time.AfterFunc(s.readIdle, cc.onHealthTimer)
	}
	go cc.readLoop()
	go cc.controlWriter()
	return cc, nil
}

// CanTakeNewStream reports whether OpenStream would take a stream now:
// false after GOAWAY or Shutdown, at the peer's MAX_CONCURRENT_STREAMS,
// when stream ids are exhausted, or when the connection is dead.
func (cc *ClientConn) CanTakeNewStream() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.refusalLocked() == ""
}

// refusalLocked says why no new stream may open ("" when one may).
func (cc *ClientConn) refusalLocked() string {
	switch {
	case cc.closed:
		return "connection closed"
	case cc.goAway:
		return "peer sent GOAWAY"
	case cc.shutdown || cc.closing:
		return "connection shutting down"
	case uint32(cc.active) >= cc.peerMaxStreams:
		return fmt.Sprintf("at the peer's MAX_CONCURRENT_STREAMS (%d)", cc.peerMaxStreams)
	case cc.nextID > clientMaxStreamID:
		return "stream ids exhausted"
	}
	return ""
}

// ActiveStreams is the number of open streams (as the peer counts them
// against MAX_CONCURRENT_STREAMS).
func (cc *ClientConn) ActiveStreams() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.active
}

// Done is closed when the connection is dead; Err then says why.
func (cc *ClientConn) Done() <-chan struct{} { return cc.done }

// Err is why the connection died (nil while alive).
func (cc *ClientConn) Err() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

// Shutdown is a graceful close: no new stream opens, streams in flight
// finish, then the connection sends GOAWAY(NO_ERROR) and closes. It
// does not block; wait on Done.
func (cc *ClientConn) Shutdown() {
	cc.mu.Lock()
	cc.shutdown = true
	cc.closeIfDrainedLocked()
	cc.mu.Unlock()
}

// Close closes the connection now: GOAWAY(NO_ERROR) (waiting at most a
// second for a stuck writer), then the socket. Streams in flight fail with
// ErrClientConnClosed. Close is idempotent.
func (cc *ClientConn) Close() error {
	cc.goAwayAndFail(http2.ErrCodeNo, ErrClientConnClosed)
	return nil
}

// fail kills the connection once: streams fail, the socket closes, Done
// closes, Events.Dead runs. In that order: a pool whose Dead comes before
// it has stored the connection (a peer that closes at once) finds nothing
// to forget, and relies on Done being closed already when it looks
// (upstream/h2pool.go). So one who sees Done closed may not see Dead run
// yet.
func (cc *ClientConn) fail(err error) {
	cc.closeOnce.Do(func() {
		cc.mu.Lock()
		if cc.dying != nil {
			err = cc.dying // the reason we sent GOAWAY for, not its write error
		} else if cc.closing {
			// A drained connection closing itself (closeIfDrainedLocked):
			// a peer that closes on our GOAWAY, before the control writer
			// gets here, ends it no less orderly.
			err = ErrClientConnClosed
		}
		cc.closed = true
		cc.err = err
		for id, s := range cc.streams {
			var serr error
			if cc.goAway && id > cc.goAwayLast {
				serr = &ClientRefusedError{StreamID: id, Reason: fmt.Sprintf("above the GOAWAY last-stream-id %d", cc.goAwayLast)}
			} else if errors.Is(err, ErrClientConnClosed) {
				serr = fmt.Errorf("h2 client: stream %d: %w", id, err)
			} else {
				serr = fmt.Errorf("h2 client: stream %d: connection lost: %w", id, err)
			}
			s.endLocked(serr, false)
		}
		clear(cc.streams)
		cc.active = 0
		cc.sendCond.Broadcast()
		for _, t := range []*time.Timer{cc.idleTimer, cc.healthTimer, cc.pingTimer} {
			if t != nil {
				t.Stop()
			}
		}
		cc.mu.Unlock()
		cc.conn.Close()
		close(cc.done)
		if cc.events.Dead != nil {
			cc.events.Dead(err)
		}
	})
}

// failConn kills the connection for a protocol error of ours to report:
// GOAWAY with code, then fail. The write deadline bounds how long a
// writer stuck on a peer that does not read can delay it (1s); the
// reason is fixed first, so that writer's error does not replace it.
func (cc *ClientConn) failConn(code http2.ErrCode, reason string) {
	cc.goAwayAndFail(code, &ClientConnError{Code: code, Reason: reason})
}

func (cc *ClientConn) goAwayAndFail(code http2.ErrCode, err error) {
	cc.mu.Lock()
	if cc.closed || cc.dying != nil {
		cc.mu.Unlock()
		cc.fail(err)
		return
	}
	cc.dying = err
	cc.mu.Unlock()
	cc.conn.SetWriteDeadline(time.Now().Add(time.Second))
	cc.wmu.Lock()
	cc.mu.Lock()
	cc.ctrl.b = clientAppendGoAway(cc.ctrl.b, 0, code)
	cc.mu.Unlock()
	cc.flushLocked()
	cc.wmu.Unlock()
	cc.fail(err)
}

// closeIfDrainedLocked queues GOAWAY and the close once a going-away or
// shut-down connection has no stream left.
func (cc *ClientConn) closeIfDrainedLocked() {
	if cc.active != 0 || cc.closing || cc.closed || !(cc.shutdown || cc.goAway || cc.nextID > clientMaxStreamID) {
		return
	}
	cc.closing = true
	cc.ctrl.b = clientAppendGoAway(cc.ctrl.b, 0, http2.ErrCodeNo)
	cc.ctrlFrames++
	cc.signalCtrlLocked()
}

func (cc *ClientConn) signalCtrlLocked() {
	select {
	case cc.wakeCtrl <- struct{}{}:
	default:
	}
}

// queueCtrlLocked counts one more queued control frame; past the bound
// the peer is flooding us.
func (cc *ClientConn) queueCtrlLocked() bool {
	cc.ctrlFrames++
	cc.signalCtrlLocked()
	return cc.ctrlFrames <= clientMaxQueuedControlFrames
}

// controlWriter writes the control queue whenever it fills.
func (cc *ClientConn) controlWriter() {
	for {
		select {
		case <-cc.wakeCtrl:
		case <-cc.done:
			return
		}
		cc.wmu.Lock()
		err := cc.flushLocked()
		cc.wmu.Unlock()
		if err != nil {
			cc.fail(fmt.Errorf("h2 client: writing to %v: %w", cc.conn.RemoteAddr(), err))
			return
		}
		cc.mu.Lock()
		closing := cc.closing && cc.ctrlFrames == 0
		cc.mu.Unlock()
		if closing {
			cc.fail(ErrClientConnClosed)
			return
		}
	}
}

// flushLocked writes the control queue and then wbuf in one write.
// wmu must be held.
func (cc *ClientConn) flushLocked() error {
	out := cc.wbuf.b
	cc.mu.Lock()
	if len(cc.ctrl.b) > 0 {
		cc.wtmp = append(append(cc.wtmp[:0], cc.ctrl.b...), cc.wbuf.b...)
		cc.ctrl.b = cc.ctrl.b[:0]
		cc.ctrlFrames = 0
		out = cc.wtmp
	}
	cc.mu.Unlock()
	cc.wbuf.b = cc.wbuf.b[:0]
	if len(out) == 0 {
		return nil
	}
	_, err := cc.conn.Write(out)
	return err
}

// readLoop reads and handles frames until the connection dies. The
// per-request frames (HEADERS, WINDOW_UPDATE) are parsed here from the
// Framer's validated header, as x/net allocates a frame for each; DATA
// (reused by the Framer) and the rest go through the Framer.
func (cc *ClientConn) readLoop() {
	for {
		fh, err := cc.fr.ReadFrameHeader()
		var f http2.Frame
		var ce *ClientConnError
		if err == nil {
			switch fh.Type {
			case http2.FrameHeaders, http2.FrameWindowUpdate:
				if !cc.gotFirst {
					ce = clientProtoErr("peer's first frame is %v, not SETTINGS (is it an HTTP/2 server?)", fh.Type)
					break
				}
				var p []byte
				if p, err = cc.readPayload(fh.Length); err != nil {
					break
				}
				cc.framesIn.Add(1)
				if fh.Type == http2.FrameHeaders {
					ce = cc.onHeadersPayload(fh, p)
				} else {
					ce = cc.onWindowUpdatePayload(fh, p)
				}
			default:
				f, err = cc.fr.ReadFrameForHeader(fh)
			}
		}
		if err != nil {
			var se http2.StreamError
			var fce http2.ConnectionError
			switch {
			case errors.As(err, &se):
				cc.resetFromReadLoop(se.StreamID, se.Code, fmt.Errorf("%v", se))
				continue
			case errors.As(err, &fce):
				cc.failConn(http2.ErrCode(fce), fmt.Sprintf("bad frame from the peer: %v", cc.fr.ErrorDetail()))
			case errors.Is(err, http2.ErrFrameTooLarge):
				cc.failConn(http2.ErrCodeFrameSize, fmt.Sprintf("peer sent a frame larger than our MAX_FRAME_SIZE %d", cc.cfg.maxFrameSize))
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				cc.fail(fmt.Errorf("h2 client: peer %v closed the connection: %w", cc.conn.RemoteAddr(), io.ErrUnexpectedEOF))
			case errors.Is(err, net.ErrClosed):
				cc.fail(fmt.Errorf("h2 client: reading from %v: %w", cc.conn.RemoteAddr(), ErrClientConnClosed))
			default:
				cc.fail(fmt.Errorf("h2 client: reading from %v: %w", cc.conn.RemoteAddr(), err))
			}
			return
		}
		if f != nil {
			cc.framesIn.Add(1)
			if !cc.gotFirst {
				if _, ok := f.(*http2.SettingsFrame); !ok || f.Header().Flags.Has(http2.FlagSettingsAck) {
					ce = clientProtoErr("peer's first frame is %v, not SETTINGS (is it an HTTP/2 server?)", f.Header().Type)
				}
				cc.gotFirst = true
			}
			if ce == nil {
				ce = cc.handleFrame(f)
			}
		}
		if ce != nil {
			cc.failConn(ce.Code, ce.Reason)
			return
		}
	}
}

// readPayload reads n payload bytes into the read loop's buffer (valid
// until the next call).
func (cc *ClientConn) readPayload(n uint32) ([]byte, error) {
	if cap(cc.rbuf) < int(n) {
		cc.rbuf = make([]byte, n)
	}
	p := cc.rbuf[:n]
	_, err := io.ReadFull(cc.br, p)
	return p, err
}

// onHeadersPayload parses a HEADERS payload (RFC 9113 §6.2).
func (cc *ClientConn) onHeadersPayload(fh http2.FrameHeader, p []byte) *ClientConnError {
	if fh.StreamID == 0 {
		return clientProtoErr("HEADERS on stream 0")
	}
	pad := 0
	if fh.Flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return &ClientConnError{Code: http2.ErrCodeFrameSize, Reason: "padded HEADERS without a pad length"}
		}
		pad, p = int(p[0]), p[1:]
	}
	if fh.Flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return &ClientConnError{Code: http2.ErrCodeFrameSize, Reason: "HEADERS with PRIORITY shorter than 5 bytes"}
		}
		p = p[5:]
	}
	if pad > len(p) {
		return clientProtoErr("HEADERS padding %d longer than its payload", pad)
	}
	return cc.onHeaders(fh.StreamID, fh.Flags.Has(http2.FlagHeadersEndStream), p[:len(p)-pad], fh.Flags.Has(http2.FlagHeadersEndHeaders))
}

// onWindowUpdatePayload parses a WINDOW_UPDATE payload (RFC 9113 §6.9).
func (cc *ClientConn) onWindowUpdatePayload(fh http2.FrameHeader, p []byte) *ClientConnError {
	if len(p) != 4 {
		return &ClientConnError{Code: http2.ErrCodeFrameSize, Reason: fmt.Sprintf("WINDOW_UPDATE of %d bytes, not 4", len(p))}
	}
	inc := (uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3])) & 0x7fffffff
	if inc == 0 {
		if fh.StreamID == 0 {
			return clientProtoErr("WINDOW_UPDATE with increment 0 on the connection")
		}
		cc.resetFromReadLoop(fh.StreamID, http2.ErrCodeProtocol, fmt.Errorf("WINDOW_UPDATE with increment 0"))
		return nil
	}
	return cc.onWindowUpdate(fh.StreamID, inc)
}

func clientProtoErr(format string, a ...any) *ClientConnError {
	return &ClientConnError{Code: http2.ErrCodeProtocol, Reason: fmt.Sprintf(format, a...)}
}

// handleFrame handles one frame on the read loop; a non-nil result is a
// connection error.
func (cc *ClientConn) handleFrame(f http2.Frame) *ClientConnError {
	switch f := f.(type) {
	case *http2.DataFrame:
		return cc.onData(f)
	case *http2.ContinuationFrame:
		return cc.onContinuation(f)
	case *http2.SettingsFrame:
		return cc.onSettings(f)
	case *http2.RSTStreamFrame:
		return cc.onReset(f)
	case *http2.PingFrame:
		return cc.onPing(f)
	case *http2.GoAwayFrame:
		return cc.onGoAway(f)
	case *http2.PushPromiseFrame:
		return clientProtoErr("peer sent PUSH_PROMISE though we disabled push")
	}
	return nil // PRIORITY, unknown extension frames: ignored (RFC 9113 §5.5)
}

// idleStreamLocked: a frame for an id we never opened.
func (cc *ClientConn) idleStreamLocked(id uint32) bool {
	return id%2 == 0 || id >= cc.nextID
}

func (cc *ClientConn) onSettings(f *http2.SettingsFrame) *ClientConnError {
	if f.IsAck() {
		cc.hdec.SetAllowedMaxDynamicTableSize(cc.cfg.headerTableSize)
		return nil
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var ce *ClientConnError
	sawMaxStreams := false
	f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			code := http2.ErrCodeProtocol
			var c http2.ConnectionError
			if errors.As(err, &c) {
				code = http2.ErrCode(c)
			}
			ce = &ClientConnError{Code: code, Reason: fmt.Sprintf("peer sent invalid setting %v", s)}
			return err
		}
		switch s.ID {
		case http2.SettingEnablePush:
			if s.Val != 0 {
				ce = clientProtoErr("server sent SETTINGS_ENABLE_PUSH=1 (RFC 9113 §6.5.2)")
				return ce
			}
		case http2.SettingMaxConcurrentStreams:
			cc.peerMaxStreams = s.Val
			sawMaxStreams = true
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - int64(cc.peerInitialWindow)
			for _, st := range cc.streams {
				w := int64(st.sendWindow) + delta
				if w > math.MaxInt32 {
					ce = &ClientConnError{Code: http2.ErrCodeFlowControl, Reason: fmt.Sprintf("SETTINGS_INITIAL_WINDOW_SIZE %d overflows stream %d's window", s.Val, st.id)}
					return ce
				}
				st.sendWindow = int32(w)
			}
			cc.peerInitialWindow = int32(s.Val)
		case http2.SettingMaxFrameSize:
			cc.peerMaxFrame = s.Val
		case http2.SettingMaxHeaderListSize:
			cc.peerMaxHeaderList = s.Val
		case http2.SettingHeaderTableSize:
			cc.peerTableSize = s.Val
		}
		return nil
	})
	if ce != nil {
		return ce
	}
	if !sawMaxStreams && cc.peerMaxStreams == clientInitialMaxStreams {
		cc.peerMaxStreams = clientDefaultMaxStreams
	}
	cc.sendCond.Broadcast()
	cc.ctrl.b = clientAppendSettingsAck(cc.ctrl.b)
	if !cc.queueCtrlLocked() {
		return &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: "SETTINGS flood: too many acknowledgements queued"}
	}
	return nil
}

func (cc *ClientConn) onPing(f *http2.PingFrame) *ClientConnError {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if f.IsAck() {
		if cc.pingOut && clientPingPayload(f.Data) == cc.pingData {
			cc.pingOut = false
			if cc.pingTimer != nil {
				cc.pingTimer.Stop()
			}
		}
		return nil
	}
	cc.ctrl.b = clientAppendPing(cc.ctrl.b, true, f.Data)
	if !cc.queueCtrlLocked() {
		return &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: "PING flood: too many acknowledgements queued"}
	}
	return nil
}

func clientPingPayload(d [8]byte) uint64 {
	var v uint64
	for _, b := range d {
		v = v<<8 | uint64(b)
	}
	return v
}

func (cc *ClientConn) onWindowUpdate(streamID, increment uint32) *ClientConnError {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	inc := int64(increment)
	if streamID == 0 {
		if int64(cc.sendWindow)+inc > math.MaxInt32 {
			return &ClientConnError{Code: http2.ErrCodeFlowControl, Reason: "WINDOW_UPDATE overflows the connection window past 2^31-1"}
		}
		cc.sendWindow += int32(inc)
		cc.sendCond.Broadcast()
		return nil
	}
	s := cc.streams[streamID]
	if s == nil {
		if cc.idleStreamLocked(streamID) {
			return clientProtoErr("WINDOW_UPDATE on idle stream %d", streamID)
		}
		return nil
	}
	if int64(s.sendWindow)+inc > math.MaxInt32 {
		return cc.resetLocked(s, http2.ErrCodeFlowControl, fmt.Errorf("WINDOW_UPDATE overflows stream %d's window past 2^31-1", s.id))
	}
	s.sendWindow += int32(inc)
	cc.sendCond.Broadcast()
	return nil
}

func (cc *ClientConn) onReset(f *http2.RSTStreamFrame) *ClientConnError {
	cc.mu.Lock()
	s := cc.streams[f.StreamID]
	if s == nil {
		idle := cc.idleStreamLocked(f.StreamID)
		cc.mu.Unlock()
		if idle {
			return clientProtoErr("RST_STREAM on idle stream %d", f.StreamID)
		}
		return nil
	}
	var err error
	if f.ErrCode == http2.ErrCodeRefusedStream && !s.gotHead {
		err = &ClientRefusedError{StreamID: s.id, Reason: "peer reset it with REFUSED_STREAM"}
	} else {
		err = &ClientStreamError{StreamID: s.id, Code: f.ErrCode, Remote: true}
	}
	if f.ErrCode == http2.ErrCodeNo && s.recvClosed {
		// The response is complete; the peer only wants no more request
		// body (RFC 9113 §8.1). Reads still end in EOF.
		s.sendErr = err
		s.sendClosed = true
		cc.forgetLocked(s)
	} else {
		s.endLocked(err, false)
		cc.forgetLocked(s)
	}
	cc.mu.Unlock()
	if cc.events.StreamReset != nil {
		cc.events.StreamReset(f.StreamID, f.ErrCode, true)
	}
	return nil
}

func (cc *ClientConn) onGoAway(f *http2.GoAwayFrame) *ClientConnError {
	cc.mu.Lock()
	if cc.goAway && f.LastStreamID > cc.goAwayLast {
		cc.mu.Unlock()
		return clientProtoErr("second GOAWAY raised last-stream-id from %d to %d", cc.goAwayLast, f.LastStreamID)
	}
	cc.goAway = true
	cc.goAwayLast = f.LastStreamID
	cc.goAwayCode = f.ErrCode
	for id, s := range cc.streams {
		if id > f.LastStreamID {
			s.endLocked(&ClientRefusedError{StreamID: id, Reason: fmt.Sprintf("above the GOAWAY last-stream-id %d (%v)", f.LastStreamID, f.ErrCode)}, false)
			cc.forgetLocked(s)
		}
	}
	cc.sendCond.Broadcast()
	cc.closeIfDrainedLocked()
	cc.mu.Unlock()
	if cc.events.GoAway != nil {
		cc.events.GoAway(f.ErrCode, f.LastStreamID, f.DebugData())
	}
	return nil
}

func (cc *ClientConn) onData(f *http2.DataFrame) *ClientConnError {
	n := int32(f.Header().Length) // padding counts against flow control
	data := f.Data()
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if n > cc.recvWindow {
		return &ClientConnError{Code: http2.ErrCodeFlowControl, Reason: fmt.Sprintf("peer sent %d bytes of DATA over the connection window %d", n, cc.recvWindow)}
	}
	cc.recvWindow -= n
	s := cc.streams[f.StreamID]
	if s == nil {
		if cc.idleStreamLocked(f.StreamID) {
			return clientProtoErr("DATA on idle stream %d", f.StreamID)
		}
		// A stream we reset or finished: give the credit back now.
		cc.creditConnLocked(n)
		return nil
	}
	if s.recvClosed {
		cc.creditConnLocked(n)
		return cc.resetLocked(s, http2.ErrCodeStreamClosed, fmt.Errorf("DATA after END_STREAM"))
	}
	if n > s.recvWindow {
		cc.creditConnLocked(n)
		return cc.resetLocked(s, http2.ErrCodeFlowControl, fmt.Errorf("peer sent %d bytes of DATA over the stream window %d", n, s.recvWindow))
	}
	s.recvWindow -= n
	if pad := n - int32(len(data)); pad > 0 {
		cc.creditConnLocked(pad)
		s.recvUnacked += pad
	}
	if !s.gotHead {
		cc.creditConnLocked(int32(len(data)))
		return cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: DATA before the response HEADERS", ErrMalformedResponse))
	}
	s.received += int64(len(data))
	if len(data) > 0 && s.noBody {
		cc.creditConnLocked(int32(len(data)))
		return cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: DATA in a response that has no body (HEAD, 204 or 304)", ErrMalformedResponse))
	}
	if s.contentLength >= 0 && s.received > s.contentLength {
		cc.creditConnLocked(int32(len(data)))
		return cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: more DATA (%d bytes so far) than content-length %d", ErrMalformedResponse, s.received, s.contentLength))
	}
	if f.StreamEnded() && s.contentLength >= 0 && s.received != s.contentLength && !s.noBody {
		cc.creditConnLocked(int32(len(data)))
		return cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: END_STREAM after %d bytes of DATA, content-length said %d", ErrMalformedResponse, s.received, s.contentLength))
	}
	if len(data) > 0 {
		if len(s.buf) == s.off {
			s.buf, s.off = s.buf[:0], 0
		} else if s.off > 0 && cap(s.buf)-len(s.buf) < len(data) {
			m := copy(s.buf, s.buf[s.off:])
			s.buf, s.off = s.buf[:m], 0
		}
		s.buf = append(s.buf, data...)
	}
	if f.StreamEnded() {
		s.recvClosed = true
		if s.sendClosed {
			cc.forgetLocked(s)
		}
	}
	s.cond.Broadcast()
	return nil
}

// creditConnLocked counts n bytes as consumed at the connection level
// and queues a WINDOW_UPDATE once half the window is owed.
func (cc *ClientConn) creditConnLocked(n int32) {
	if n <= 0 || cc.closed {
		return
	}
	cc.recvUnacked += n
	if cc.recvUnacked >= cc.cfg.connWindow/2 {
		cc.ctrl.b = clientAppendWindowUpdate(cc.ctrl.b, 0, uint32(cc.recvUnacked))
		cc.recvWindow += cc.recvUnacked
		cc.recvUnacked = 0
		cc.queueCtrlLocked()
	}
}

// resetLocked resets s from our side with code (RST_STREAM queued), for
// cause. It returns nil, or a connection error when the control queue
// overflows.
func (cc *ClientConn) resetLocked(s *ClientStream, code http2.ErrCode, cause error) *ClientConnError {
	err := &ClientStreamError{StreamID: s.id, Code: code, Cause: cause}
	cc.sendResetLocked(s, code, err)
	if !cc.queueCtrlLocked() {
		return &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: "too many RST_STREAM queued (peer not reading)"}
	}
	if cc.events.StreamReset != nil {
		cc.events.StreamReset(s.id, code, false)
	}
	return nil
}

// sendResetLocked ends s with err and queues RST_STREAM(code); the
// caller counts the queued frame.
func (cc *ClientConn) sendResetLocked(s *ClientStream, code http2.ErrCode, err error) {
	s.endLocked(err, true)
	cc.forgetLocked(s)
	cc.ctrl.b = clientAppendRSTStream(cc.ctrl.b, s.id, code)
}

// resetFromReadLoop handles a stream error the framer found.
func (cc *ClientConn) resetFromReadLoop(id uint32, code http2.ErrCode, cause error) {
	cc.mu.Lock()
	s := cc.streams[id]
	var ce *ClientConnError
	if s != nil {
		ce = cc.resetLocked(s, code, cause)
	} else {
		cc.ctrl.b = clientAppendRSTStream(cc.ctrl.b, id, code)
		if !cc.queueCtrlLocked() {
			ce = &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: "too many RST_STREAM queued (peer not reading)"}
		}
	}
	cc.mu.Unlock()
	if ce != nil {
		cc.failConn(ce.Code, ce.Reason)
	}
}

// forgetLocked removes s from the connection's streams.
func (cc *ClientConn) forgetLocked(s *ClientStream) {
	if !s.inMap {
		return
	}
	s.inMap = false
	delete(cc.streams, s.id)
	cc.active--
	cc.sendCond.Broadcast()
	if cc.active == 0 {
		cc.idleSince = time.Now()
		if cc.idleTimer != nil {
			cc.idleTimer.Reset(cc.cfg.idleTimeout)
		}
		cc.closeIfDrainedLocked()
	}
}

func (cc *ClientConn) onIdleTimer() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed || cc.active > 0 {
		return
	}
	if left := cc.cfg.idleTimeout - time.Since(cc.idleSince); left > 0 {
		cc.idleTimer.Reset(left)
		return
	}
	cc.shutdown = true
	cc.closeIfDrainedLocked()
}

// onHealthTimer sends a PING when nothing arrived for ReadIdleTimeout.
func (cc *ClientConn) onHealthTimer() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed {
		return
	}
	seen := cc.framesIn.Load()
	if seen == cc.healthSeen && !cc.pingOut {
		cc.pingOut = true
		cc.pingData = seen ^ 0x6870726f7879 // "hproxy"
		var d [8]byte
		for i := range d {
			d[i] = byte(cc.pingData >> (56 - 8*i))
		}
		cc.ctrl.b = clientAppendPing(cc.ctrl.b, false, d)
		cc.queueCtrlLocked()
		if cc.pingTimer == nil {
			cc.pingTimer = time.AfterFunc(cc.cfg.pingTimeout, cc.onPingTimeout)
		} else {
			cc.pingTimer.Reset(cc.cfg.pingTimeout)
		}
	}
	cc.healthSeen = seen
	cc.healthTimer.Reset(cc.cfg.readIdle)
}

func (cc *ClientConn) onPingTimeout() {
	cc.mu.Lock()
	out := cc.pingOut
	cc.mu.Unlock()
	if out {
		cc.fail(fmt.Errorf("%w (no PING ACK from %v within %v)", ErrPingTimeout, cc.conn.RemoteAddr(), cc.cfg.pingTimeout))
	}
}

// Header blocks. onHeaderField is the HPACK decoder's emit function.
func (cc *ClientConn) onHeaderField(f hpack.HeaderField) {
	h := &cc.hdr
	if h.tooLarge {
		return
	}
	h.size += uint64(f.Size())
	if h.size > uint64(cc.cfg.maxHeaderListSize) {
		h.tooLarge = true
		h.fields = h.fields[:0]
		cc.hdec.SetEmitEnabled(false)
		return
	}
	h.fields = append(h.fields, f)
}

func (cc *ClientConn) onHeaders(streamID uint32, endStream bool, frag []byte, endHeaders bool) *ClientConnError {
	cc.mu.Lock()
	idle := cc.idleStreamLocked(streamID)
	cc.mu.Unlock()
	if idle {
		return clientProtoErr("HEADERS on stream %d, which we never opened", streamID)
	}
	h := &cc.hdr
	h.streamID, h.endStream = streamID, endStream
	h.bytes, h.frames, h.size, h.tooLarge = 0, 0, 0, false
	h.fields = h.fields[:0]
	cc.hdec.SetEmitEnabled(true)
	return cc.headerFragment(frag, endHeaders)
}

func (cc *ClientConn) onContinuation(f *http2.ContinuationFrame) *ClientConnError {
	return cc.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
}

func (cc *ClientConn) headerFragment(frag []byte, end bool) *ClientConnError {
	h := &cc.hdr
	h.bytes += len(frag)
	h.frames++
	if h.bytes > cc.cfg.maxHeaderBytes {
		return &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: fmt.Sprintf("response header block of stream %d over %d bytes", h.streamID, cc.cfg.maxHeaderBytes)}
	}
	if h.frames > cc.cfg.maxHeaderFrames {
		return &ClientConnError{Code: http2.ErrCodeEnhanceYourCalm, Reason: fmt.Sprintf("response header block of stream %d spans over %d frames (CONTINUATION flood)", h.streamID, cc.cfg.maxHeaderFrames)}
	}
	if _, err := cc.hdec.Write(frag); err != nil {
		return &ClientConnError{Code: http2.ErrCodeCompression, Reason: fmt.Sprintf("HPACK decoding stream %d: %v", h.streamID, err)}
	}
	if !end {
		return nil
	}
	if err := cc.hdec.Close(); err != nil {
		return &ClientConnError{Code: http2.ErrCodeCompression, Reason: fmt.Sprintf("HPACK decoding stream %d: %v", h.streamID, err)}
	}
	return cc.headerBlockDone()
}

// headerBlockDone hands a complete, decoded block to its stream.
func (cc *ClientConn) headerBlockDone() *ClientConnError {
	h := &cc.hdr
	cc.mu.Lock()
	s := cc.streams[h.streamID]
	if s == nil || s.recvClosed {
		if s != nil { // HEADERS after END_STREAM
			ce := cc.resetLocked(s, http2.ErrCodeStreamClosed, fmt.Errorf("HEADERS after END_STREAM"))
			cc.mu.Unlock()
			return ce
		}
		cc.mu.Unlock()
		return nil // a stream we already closed: decoded, dropped
	}
	if h.tooLarge {
		ce := cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: header list over our MAX_HEADER_LIST_SIZE %d", ErrMalformedResponse, cc.cfg.maxHeaderListSize))
		cc.mu.Unlock()
		return ce
	}
	if s.gotHead {
		// Trailers: must end the stream, no pseudo-headers.
		var bad error
		if !h.endStream {
			bad = fmt.Errorf("%w: a second HEADERS without END_STREAM", ErrMalformedResponse)
		} else if err := clientCheckTrailers(h.fields); err != nil {
			bad = fmt.Errorf("%w: trailers: %v", ErrMalformedResponse, err)
		} else if s.contentLength >= 0 && s.received != s.contentLength && !s.noBody {
			bad = fmt.Errorf("%w: stream ended after %d bytes of DATA, content-length said %d", ErrMalformedResponse, s.received, s.contentLength)
		}
		if bad != nil {
			ce := cc.resetLocked(s, http2.ErrCodeProtocol, bad)
			cc.mu.Unlock()
			return ce
		}
		s.trailers = append(s.trailers[:0], h.fields...)
		s.recvClosed = true
		if s.sendClosed {
			cc.forgetLocked(s)
		}
		s.cond.Broadcast()
		cc.mu.Unlock()
		return nil
	}
	status, cl, kind, err := clientCheckResponseHead(h.fields)
	if err == nil && kind == clientHeadInformational {
		s.informational++
		switch {
		case h.endStream:
			err = fmt.Errorf("a %d response with END_STREAM", status)
		case s.informational > clientMaxInformational:
			err = fmt.Errorf("more than %d informational responses", clientMaxInformational)
		}
		if err == nil {
			cb := s.onInformational
			cc.mu.Unlock()
			if cb != nil {
				cb(status, h.fields)
			}
			return nil
		}
	}
	if err != nil {
		ce := cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: %v", ErrMalformedResponse, err))
		cc.mu.Unlock()
		return ce
	}
	s.noBody = s.isHead || status == 204 || status == 304
	if h.endStream && cl > 0 && !s.noBody {
		ce := cc.resetLocked(s, http2.ErrCodeProtocol, fmt.Errorf("%w: END_STREAM on the head, content-length said %d", ErrMalformedResponse, cl))
		cc.mu.Unlock()
		return ce
	}
	s.status = status
	s.contentLength = cl
	s.fields = append(s.fields[:0], h.fields...)
	s.gotHead = true
	if h.endStream {
		s.headEnded = true
		s.recvClosed = true
		if s.sendClosed {
			cc.forgetLocked(s)
		}
	}
	s.cond.Broadcast()
	cc.mu.Unlock()
	return nil
}

// Frame writers: append one frame to b (RFC 9113 §4.1 header + payload).

func clientAppendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, id uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(t), byte(flags),
		byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id))
}

func clientAppendSettings(b []byte, settings []http2.Setting) []byte {
	b = clientAppendFrameHeader(b, 6*len(settings), http2.FrameSettings, 0, 0)
	for _, s := range settings {
		b = append(b, byte(s.ID>>8), byte(s.ID), byte(s.Val>>24), byte(s.Val>>16), byte(s.Val>>8), byte(s.Val))
	}
	return b
}

func clientAppendSettingsAck(b []byte) []byte {
	return clientAppendFrameHeader(b, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
}

func clientAppendWindowUpdate(b []byte, id, inc uint32) []byte {
	b = clientAppendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, id)
	return append(b, byte(inc>>24)&0x7f, byte(inc>>16), byte(inc>>8), byte(inc))
}

func clientAppendPing(b []byte, ack bool, data [8]byte) []byte {
	var flags http2.Flags
	if ack {
		flags = http2.FlagPingAck
	}
	b = clientAppendFrameHeader(b, 8, http2.FramePing, flags, 0)
	return append(b, data[:]...)
}

func clientAppendRSTStream(b []byte, id uint32, code http2.ErrCode) []byte {
	b = clientAppendFrameHeader(b, 4, http2.FrameRSTStream, 0, id)
	return append(b, byte(code>>24), byte(code>>16), byte(code>>8), byte(code))
}

func clientAppendGoAway(b []byte, last uint32, code http2.ErrCode) []byte {
	b = clientAppendFrameHeader(b, 8, http2.FrameGoAway, 0, 0)
	return append(b, byte(last>>24)&0x7f, byte(last>>16), byte(last>>8), byte(last),
		byte(code>>24), byte(code>>16), byte(code>>8), byte(code))
}

func clientAppendData(b []byte, id uint32, end bool, p []byte) []byte {
	var flags http2.Flags
	if end {
		flags = http2.FlagDataEndStream
	}
	b = clientAppendFrameHeader(b, len(p), http2.FrameData, flags, id)
	return append(b, p...)
}

// clientAppendHeaders writes a header block as HEADERS and as many
// CONTINUATION frames as maxFrame requires.
func clientAppendHeaders(b []byte, id uint32, end bool, block []byte, maxFrame int) []byte {
	first := true
	for {
		chunk := block
		if len(chunk) > maxFrame {
			chunk = chunk[:maxFrame]
		}
		block = block[len(chunk):]
		var flags http2.Flags
		if len(block) == 0 {
			flags |= http2.FlagHeadersEndHeaders
		}
		if first {
			if end {
				flags |= http2.FlagHeadersEndStream
			}
			b = clientAppendFrameHeader(b, len(chunk), http2.FrameHeaders, flags, id)
		} else {
			b = clientAppendFrameHeader(b, len(chunk), http2.FrameContinuation, flags, id)
		}
		b = append(b, chunk...)
		first = false
		if len(block) == 0 {
			return b
		}
	}
}

func (w *clientBuf) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}
