package h2

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Defaults for a zero ServerConfig field.
const (
	DefaultMaxConcurrentStreams   = 100
	DefaultStreamWindow           = 256 << 10
	DefaultConnWindow             = 1 << 20
	DefaultMaxFrameSize           = 16 << 10
	DefaultMaxHeaderListSize      = 64 << 10
	DefaultHeaderTableSize        = 4096
	DefaultMaxRequestBodyBuffer   = 64 << 10
	DefaultResetBurst             = 1000
	DefaultResetPerSecond         = 200
	DefaultMaxQueuedControlFrames = 10000
	DefaultIdleTimeout            = 3 * time.Minute
	DefaultWriteStallTimeout      = 30 * time.Second

	// ShutdownPingTimeout bounds the wait for the PING ack of a graceful
	// Shutdown before the final GOAWAY names the last stream.
	ShutdownPingTimeout = time.Second
	// closeLinger bounds how long a closing connection keeps reading (and
	// discarding) so that its GOAWAY is not lost to a TCP reset.
	closeLinger = time.Second
	// closeLingerFrames bounds the frames a closing connection discards:
	// a flooding client that keeps writing sees the socket close (and
	// its writes fail) soon after its GOAWAY, not a second later.
	closeLingerFrames = 16 << 10
	// maxWriteBuffered is how many encoded bytes may wait for the writer
	// before stream writes block: the bound on response memory per
	// connection when the client reads slowly.
	maxWriteBuffered = 128 << 10
	// flushThreshold: a stream's writes are flushed without waiting for the
	// end of its response once this much is queued.
	flushThreshold = 16 << 10
)

// ServerConfig tunes a server connection. The zero value of every field
// means its Default constant; a negative timeout disables it.
type ServerConfig struct {
	// MaxConcurrentStreams is advertised and enforced; a stream counts
	// until its handler returns, even after a client RST_STREAM (Rapid
	// Reset, CVE-2023-44487).
	MaxConcurrentStreams uint32
	// StreamWindow and ConnWindow are our receive windows.
	StreamWindow, ConnWindow int32
	MaxFrameSize             uint32 // SETTINGS_MAX_FRAME_SIZE we accept
	MaxHeaderListSize        uint32 // decoded request header list; beyond: 431
	HeaderTableSize          uint32 // HPACK dynamic table the client may use
	// MaxHeaderBlockBytes bounds the encoded header block across HEADERS
	// and CONTINUATION frames (CVE-2023-45288); beyond: GOAWAY
	// PROTOCOL_ERROR, as x/net does. Default: MaxHeaderListSize.
	MaxHeaderBlockBytes int
	// MaxRequestBodyBuffer: a request whose whole body arrives within this
	// many bytes is handed to the handler buffered. Capped at StreamWindow.
	MaxRequestBodyBuffer int
	// ResetBurst and ResetPerSecond are a token bucket over client
	// RST_STREAM frames and the resets the client caused; empty it and the
	// connection gets GOAWAY ENHANCE_YOUR_CALM.
	ResetBurst     int
	ResetPerSecond float64
	// MaxQueuedControlFrames bounds SETTINGS/PING acks and RST_STREAM
	// replies queued but not yet written; beyond: GOAWAY ENHANCE_YOUR_CALM.
	MaxQueuedControlFrames int
	// ControlFrameBurst and ControlFramesPerSecond are the budget of
	// frames that carry no request (framebudget.go); 0: its defaults.
	ControlFrameBurst      int
	ControlFramesPerSecond float64
	// IdleTimeout closes (GOAWAY NO_ERROR) a connection without streams.
	IdleTimeout time.Duration
	// WriteStallTimeout resets a stream whose send window stays closed this
	// long, and closes a connection whose socket write blocks this long.
	WriteStallTimeout time.Duration
	// Events lets the caller count what happens without this package
	// importing stats.
	Events Events
}

// Events are optional callbacks. They run with the connection's lock held:
// they must only count, never block or call back into this package.
type Events struct {
	GoAwaySent    func(code http2.ErrCode, reason string)
	StreamReset   func(code http2.ErrCode, byPeer bool)
	FloodDetected func(kind string) // "reset", "control", "empty-frames", "header-block"
}

// Handler serves one request stream. ServeH2 is called once request
// headers are complete, and also the body when it fits MaxRequestBodyBuffer
// and END_STREAM arrived. Returning ends the response (END_STREAM after
// headers, RST_STREAM INTERNAL_ERROR if none were written); the Stream must
// not be used after ServeH2 returns.
type Handler interface{ ServeH2(st *Stream) }

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(st *Stream)

// ServeH2 calls f(st).
func (f HandlerFunc) ServeH2(st *Stream) { f(st) }

var (
	// ErrStreamClosed: the stream was reset or the connection went away.
	ErrStreamClosed = errors.New("h2: stream closed")
	// ErrStreamStalled: the peer kept the send window closed past
	// WriteStallTimeout, and the stream was reset.
	ErrStreamStalled = errors.New("h2: stream reset: send window closed past WriteStallTimeout")
	// ErrBadPreface: the connection did not start with the HTTP/2 preface.
	ErrBadPreface = errors.New("h2: client preface missing or invalid")
)

var serverWantsPreface = []byte(http2.ClientPreface)

// shutdownPing is the payload of the PING a graceful Shutdown sends.
var shutdownPing = [8]byte{'h', 'p', 'd', 'r', 'a', 'i', 'n', 0}

func (c *ServerConfig) withDefaults() ServerConfig {
	d := *c
	if d.MaxConcurrentStreams == 0 {
		d.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if d.StreamWindow <= 0 {
		d.StreamWindow = DefaultStreamWindow
	}
	if d.ConnWindow <= 0 {
		d.ConnWindow = DefaultConnWindow
	}
	if d.ConnWindow < 65535 {
		d.ConnWindow = 65535 // the connection window cannot be lowered (§6.9.2)
	}
	if d.MaxFrameSize == 0 {
		d.MaxFrameSize = DefaultMaxFrameSize
	}
	d.MaxFrameSize = min(max(d.MaxFrameSize, 1<<14), 1<<24-1)
	if d.MaxHeaderListSize == 0 {
		d.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if d.HeaderTableSize == 0 {
		d.HeaderTableSize = DefaultHeaderTableSize
	}
	if d.MaxHeaderBlockBytes <= 0 {
		d.MaxHeaderBlockBytes = int(d.MaxHeaderListSize)
	}
	if d.MaxRequestBodyBuffer <= 0 {
		d.MaxRequestBodyBuffer = DefaultMaxRequestBodyBuffer
	}
	d.MaxRequestBodyBuffer = min(d.MaxRequestBodyBuffer, int(d.StreamWindow))
	if d.ResetBurst <= 0 {
		d.ResetBurst = DefaultResetBurst
	}
	if d.ResetPerSecond <= 0 {
		d.ResetPerSecond = DefaultResetPerSecond
	}
	if d.MaxQueuedControlFrames <= 0 {
		d.MaxQueuedControlFrames = DefaultMaxQueuedControlFrames
	}
	if d.ControlFrameBurst <= 0 {
		d.ControlFrameBurst = ControlFrameBurst
	}
	if d.ControlFramesPerSecond <= 0 {
		d.ControlFramesPerSecond = ControlFramesPerSecond
	}
	if d.IdleTimeout == 0 {
		d.IdleTimeout = DefaultIdleTimeout
	}
	if d.WriteStallTimeout == 0 {
		d.WriteStallTimeout = DefaultWriteStallTimeout
	}
	return d
}

// tokenBucket rate-limits resets and empty frames per connection.
type tokenBucket struct {
	tokens, burst, rate float64
	last                time.Time
}

func (b *tokenBucket) init(burst int, rate float64) {
	b.burst, b.rate, b.tokens = float64(burst), rate, float64(burst)
}

// take reports false once the bucket is empty.
func (b *tokenBucket) take(now time.Time) bool {
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// ServerConn is one server-side HTTP/2 connection.
type ServerConn struct {
	conn net.Conn
	cfg  ServerConfig
	h    Handler

	// Owned by the read loop (Serve's goroutine).
	br         *bufio.Reader
	rfr        *http2.Framer
	dec        *hpack.Decoder
	chk        fieldChecker
	hdrStream  *Stream // stream whose header block is being decoded; nil: discard
	hdrBytes   int     // encoded bytes of the block so far
	hdrTrailer bool
	hdrLive    bool         // a header block is in progress (HEADERS without END_HEADERS)
	hdrFrame   headersFrame // the last HEADERS frame read, parsed in place
	hdrPayload []byte       // its payload (MaxFrameSize bytes)
	// pendingDispatch: requests without content-length whose body has not
	// ended yet; dispatched streaming once the read buffer is drained.
	pendingDispatch []pendingStream
	sawSettings     bool

	flushWake  chan struct{} // cap 1: frames are queued
	writerDone chan struct{}
	workCh     chan *Stream // idle handler goroutines wait here

	mu   sync.Mutex // guards everything below, and every Stream's mutable state
	cond sync.Cond  // on mu: windows opened, data arrived, buffer drained, stream closed

	streams      map[uint32]*Stream
	maxClientID  uint32
	inFlight     int // streams counted against MaxConcurrentStreams
	idleWorkers  int
	peer         peerSettings
	send         sendWindow // connection send window
	recv         recvWindow // connection receive window
	wfr          *http2.Framer
	wb           writeBuf
	enc          *hpack.Encoder
	encBuf       bytes.Buffer
	encStrings   fieldInterner // the strings enc may keep (guarded by mu, as enc)
	queuedCtl    int
	resets       tokenBucket
	empties      tokenBucket
	controls     tokenBucket
	shuttingDown bool   // first GOAWAY sent
	finalGoAway  bool   // GOAWAY naming the last stream sent
	lastStreamID uint32 // valid with finalGoAway
	closing      bool   // no more frames accepted; writer flushes and stops
	closeErr     error
	idleTimer    *time.Timer
	shutTimer    *time.Timer
	stallTimer   *time.Timer
	stallArmed   bool
	writeErr     error

	// started: our SETTINGS are queued; a Shutdown before waits for it.
	started, shutdownOnStart bool
}

// NewServerConn prepares a server connection on c. preread holds bytes the
// caller already read from c (for h2c prior knowledge, the start of the
// preface "PRI * HTTP/2.0"); they are consumed before c. cfg may be nil.
func NewServerConn(c net.Conn, preread []byte, cfg *ServerConfig, h Handler) *ServerConn {
	if cfg == nil {
		cfg = &ServerConfig{}
	}
	sc := &ServerConn{conn: c, cfg: cfg.withDefaults(), h: h}
	var r io.Reader = c
	if len(preread) > 0 {
		r = io.MultiReader(bytes.NewReader(preread), c)
	}
	sc.br = bufio.NewReaderSize(r, 16<<10)
	sc.rfr = http2.NewFramer(nil, sc.br)
	sc.rfr.SetMaxReadFrameSize(sc.cfg.MaxFrameSize)
	sc.rfr.SetReuseFrames()
	sc.hdrPayload = make([]byte, sc.cfg.MaxFrameSize)
	sc.dec = hpack.NewDecoder(sc.cfg.HeaderTableSize, sc.emitField)
	sc.dec.SetMaxStringLength(int(sc.cfg.MaxHeaderListSize))
	sc.cond.L = &sc.mu
	sc.streams = make(map[uint32]*Stream)
	sc.peer = initialPeerSettings()
	sc.send = sendWindow{n: 65535}
	sc.recv = newRecvWindow(sc.cfg.ConnWindow)
	sc.wfr = http2.NewFramer(&sc.wb, nil)
	sc.enc = hpack.NewEncoder(&sc.encBuf)
	sc.resets.init(sc.cfg.ResetBurst, sc.cfg.ResetPerSecond)
	// Empty DATA/CONTINUATION frames do nothing useful: ten times the
	// reset budget is generous for any honest client.
	sc.empties.init(10*sc.cfg.ResetBurst, 10*sc.cfg.ResetPerSecond)
	sc.controls.init(sc.cfg.ControlFrameBurst, sc.cfg.ControlFramesPerSecond) // framebudget.go
	sc.flushWake = make(chan struct{}, 1)
	sc.writerDone = make(chan struct{})
	sc.workCh = make(chan *Stream, sc.cfg.MaxConcurrentStreams)
	return sc
}

// StreamsInFlight is how many streams count against MaxConcurrentStreams:
// open ones and those whose handler still runs.
func (sc *ServerConn) StreamsInFlight() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.inFlight
}

// Serve runs the connection's read loop in the calling goroutine and
// returns when the connection is closed: nil after a graceful end (client
// EOF, Shutdown, idle timeout), otherwise what went wrong. Handlers still
// running see their Stream's Done closed and writes fail.
func (sc *ServerConn) Serve() error {
	defer sc.conn.Close()
	var preface [24]byte
	if _, err := io.ReadFull(sc.br, preface[:]); err != nil || !bytes.Equal(preface[:], serverWantsPreface) {
		close(sc.writerDone)
		if err == nil {
			err = ErrBadPreface
		}
		return fmt.Errorf("h2: reading client preface: %w", errors.Join(ErrBadPreface, err))
	}
	sc.mu.Lock()
	sc.wfr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: sc.cfg.MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(sc.cfg.StreamWindow)},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: sc.cfg.MaxFrameSize},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: sc.cfg.MaxHeaderListSize},
		http2.Setting{ID: http2.SettingHeaderTableSize, Val: sc.cfg.HeaderTableSize},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
	)
	if inc := sc.cfg.ConnWindow - 65535; inc > 0 {
		sc.wfr.WriteWindowUpdate(0, uint32(inc))
	}
	sc.recv.avail = sc.cfg.ConnWindow
	if sc.cfg.IdleTimeout > 0 {
		sc.idleTimer = time.AfterFunc(sc.cfg.IdleTimeout, sc.idleFired)
	}
	sc.started = true
	if sc.shutdownOnStart {
		sc.shutdownLocked()
	}
	sc.mu.Unlock()
	sc.wakeWriter()
	go sc.writeLoop()

	var readErr error
	lingered := 0
	for {
		f, hf, err := sc.readFrame()
		sc.mu.Lock()
		if sc.closing {
			sc.mu.Unlock()
			if lingered++; err != nil || lingered > closeLingerFrames {
				break
			}
			continue // lingering: discard until EOF, the deadline or closeLingerFrames
		}
		if err != nil {
			sc.readErrorLocked(err)
			if sc.closeErr == nil && !isEOF(err) {
				readErr = err
			}
			sc.mu.Unlock()
			continue
		}
		var cerr error
		if hf != nil {
			cerr = sc.processHeadersLocked(hf)
		} else {
			cerr = sc.processFrameLocked(f)
		}
		if cerr != nil {
			sc.connErrorLocked(cerr)
		}
		if len(sc.pendingDispatch) > 0 && sc.br.Buffered() == 0 && !sc.closing {
			sc.dispatchPendingLocked()
		}
		sc.mu.Unlock()
	}
	sc.mu.Lock()
	sc.closeLocked(nil, false) // the read side ended: tear down what is left
	sc.mu.Unlock()
	// The writer flushes the last frames (GOAWAY); a client that does not
	// read gets closeLinger, then the socket closes under the writer.
	linger := time.NewTimer(closeLinger)
	select {
	case <-sc.writerDone:
	case <-linger.C:
	}
	linger.Stop()
	sc.mu.Lock()
	err := sc.closeErr
	sc.mu.Unlock()
	if err == nil {
		err = readErr
	}
	return err
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// readErrorLocked maps an error of the Framer to the protocol's reaction.
func (sc *ServerConn) readErrorLocked(err error) {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		// The Framer read the whole frame: the connection stays usable.
		if se.StreamID > sc.maxClientID && se.StreamID%2 == 1 && sc.hdrLive {
			sc.connErrorLocked(connErr(http2.ErrCodeProtocol, "stream error inside a header block"))
			return
		}
		sc.resetStreamLocked(se.StreamID, se.Code, true)
	case errors.As(err, &ce):
		reason := "frame rejected by the framer"
		if d := sc.rfr.ErrorDetail(); d != nil {
			reason = d.Error()
		}
		sc.connErrorLocked(connErr(http2.ErrCode(ce), reason))
	case errors.Is(err, http2.ErrFrameTooLarge):
		sc.connErrorLocked(connErr(http2.ErrCodeFrameSize, "frame larger than SETTINGS_MAX_FRAME_SIZE"))
	default:
		// EOF, a reset, a deadline: nothing more can be said to the peer.
		sc.closeLocked(nil, false)
	}
}

// h2ConnError is a connection error: GOAWAY with code and reason, close.
type h2ConnError struct {
	code   http2.ErrCode
	reason string
}

func (e *h2ConnError) Error() string {
	return fmt.Sprintf("h2: connection error %v: %s", e.code, e.reason)
}

func connErr(code http2.ErrCode, reason string) error { return &h2ConnError{code, reason} }

// connErrorLocked sends GOAWAY for err and closes the connection.
func (sc *ServerConn) connErrorLocked(err error) {
	if err == nil || sc.closing {
		return
	}
	var ce *h2ConnError
	if errors.As(err, &ce) {
		sc.goAwayLocked(sc.maxClientID, ce.code, ce.reason)
		if ce.code == http2.ErrCodeNo {
			err = nil
		}
	}
	sc.closeLocked(err, true)
}

func (sc *ServerConn) goAwayLocked(last uint32, code http2.ErrCode, reason string) {
	var debug []byte
	if code != http2.ErrCodeNo {
		debug = []byte(reason)
	}
	sc.wfr.WriteGoAway(last, code, debug)
	if ev := sc.cfg.Events.GoAwaySent; ev != nil {
		ev(code, reason)
	}
	sc.wakeWriter()
}

// closeLocked stops the connection: every stream is torn down, the writer
// flushes what is queued (the GOAWAY) and stops, and the read loop lingers
// up to closeLinger so the peer reads the GOAWAY before the socket closes.
func (sc *ServerConn) closeLocked(err error, linger bool) {
	if sc.closing {
		return
	}
	sc.closing = true
	sc.closeErr = err
	for id, st := range sc.streams {
		delete(sc.streams, id)
		st.inMap = false
		st.abortLocked(ErrStreamClosed)
		sc.releaseLocked(st)
	}
	if sc.idleTimer != nil {
		sc.idleTimer.Stop()
	}
	if sc.shutTimer != nil {
		sc.shutTimer.Stop()
	}
	if sc.stallTimer != nil {
		sc.stallTimer.Stop()
	}
	close(sc.workCh)
	sc.cond.Broadcast()
	if linger {
		sc.conn.SetReadDeadline(time.Now().Add(closeLinger))
	} else {
		sc.conn.SetReadDeadline(time.Now())
	}
	sc.wakeWriter()
}

func (sc *ServerConn) wakeWriter() {
	select {
	case sc.flushWake <- struct{}{}:
	default:
	}
}

// writeLoop is the connection's one writer: it takes every queued frame
// and writes them in one system call.
//
// A wake puts the writer first in line (Go's scheduler runs the goroutine
// a channel send readied next), so, left alone, it would write each
// stream's response on its own as soon as that stream's handler parks:
// a TLS record and a write(2) per response. It yields once instead, so
// that the handlers runnable now (responses the poller reported together)
// queue their frames first, and their responses share one record and one
// write. The wake they send meanwhile is consumed here: this turn takes
// their frames.
func (sc *ServerConn) writeLoop() {
	defer close(sc.writerDone)
	for range sc.flushWake {
		runtime.Gosched()
		select {
		case <-sc.flushWake:
		default:
		}
		sc.mu.Lock()
		buf := sc.wb.take()
		sc.queuedCtl = 0
		closing := sc.closing
		sc.mu.Unlock()
		var err error
		if len(buf) > 0 {
			if sc.cfg.WriteStallTimeout > 0 {
				sc.conn.SetWriteDeadline(time.Now().Add(sc.cfg.WriteStallTimeout))
			}
			_, err = sc.conn.Write(buf)
		}
		sc.mu.Lock()
		sc.wb.giveBack(buf)
		if err != nil && sc.writeErr == nil {
			sc.writeErr = err
			sc.closeLocked(fmt.Errorf("h2: writing to client: %w", err), false)
			closing = true
		}
		sc.cond.Broadcast()
		if sc.wb.len() > 0 && sc.writeErr == nil {
			sc.wakeWriter()
			sc.mu.Unlock()
			continue
		}
		sc.mu.Unlock()
		if closing || sc.isClosing() {
			if cw, ok := sc.conn.(interface{ CloseWrite() error }); ok && err == nil {
				cw.CloseWrite()
			}
			return
		}
	}
}

func (sc *ServerConn) isClosing() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.closing && sc.wb.len() == 0
}

// queueControlLocked counts a reply frame the peer provoked; too many
// unwritten means the peer does not read what it asks for.
func (sc *ServerConn) queueControlLocked() error {
	sc.queuedCtl++
	if sc.queuedCtl > sc.cfg.MaxQueuedControlFrames {
		sc.floodLocked("control")
		return connErr(http2.ErrCodeEnhanceYourCalm, "too many control frames queued unread")
	}
	sc.wakeWriter()
	return nil
}

func (sc *ServerConn) floodLocked(kind string) {
	if ev := sc.cfg.Events.FloodDetected; ev != nil {
		ev(kind)
	}
}

// Shutdown drains the connection gracefully: GOAWAY(2^31-1) and a PING,
// then, on the PING ack or after ShutdownPingTimeout, GOAWAY naming the
// last stream the client opened; streams in flight finish, then the
// connection closes. Idempotent; it does not wait.
func (sc *ServerConn) Shutdown() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.started {
		// Our SETTINGS must be the first frame: the GOAWAY follows
		// them, once Serve has read the client's preface.
		sc.shutdownOnStart = true
		return
	}
	sc.shutdownLocked()
}

func (sc *ServerConn) shutdownLocked() {
	if sc.shuttingDown || sc.closing {
		return
	}
	sc.shuttingDown = true
	sc.goAwayLocked(maxWindow, http2.ErrCodeNo, "shutdown")
	sc.wfr.WritePing(false, shutdownPing)
	sc.shutTimer = time.AfterFunc(ShutdownPingTimeout, func() {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		sc.finalGoAwayLocked()
	})
}

func (sc *ServerConn) finalGoAwayLocked() {
	if sc.finalGoAway || sc.closing {
		return
	}
	sc.finalGoAway = true
	sc.lastStreamID = sc.maxClientID
	sc.goAwayLocked(sc.lastStreamID, http2.ErrCodeNo, "shutdown")
	sc.maybeFinishLocked()
}

// maybeFinishLocked closes a draining connection once no stream is left.
func (sc *ServerConn) maybeFinishLocked() {
	if sc.finalGoAway && sc.inFlight == 0 && !sc.closing {
		sc.closeLocked(nil, true)
	}
}

func (sc *ServerConn) idleFired() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.inFlight == 0 && !sc.closing {
		sc.finalGoAway = true
		sc.lastStreamID = sc.maxClientID
		sc.goAwayLocked(sc.maxClientID, http2.ErrCodeNo, "idle timeout")
		sc.closeLocked(nil, true)
	}
}
