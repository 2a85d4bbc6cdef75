package workers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// The HTTP/2 connection guard: what x/net's Server does not bound.
//
// x/net bounds concurrent streams (counted until their handler ends, with
// a GOAWAY when too many reset ones queue up), header blocks, CONTINUATION
// frames, the HPACK table and queued control-frame replies; it does not
// bound the rate of frames that cost the server work but carry no request
// (a SETTINGS flood kept a core busy for 8 s with 3–6 M frames), nor the
// rate of resets (Rapid Reset: every reset stream starts a handler), and
// its drain sends one GOAWAY with the last stream id it has seen, which
// races the requests the client is sending at that moment. It offers no
// hook for any of it, so the guard sits under it, in the net.Conn that
// ServeConn reads and writes (h2NetConn):
//
//   - Inbound, it follows the frame headers (after the 24-byte client
//     preface) of every byte x/net reads, and charges each frame that
//     carries no request to a per-connection budget (h2Budget): SETTINGS,
//     PING, WINDOW_UPDATE, PRIORITY, PRIORITY_UPDATE, empty DATA without
//     END_STREAM, frames of unknown or unexpected types to one, RST_STREAM
//     to one of its own. Past a budget the connection gets a GOAWAY
//     ENHANCE_YOUR_CALM, and x/net a read error, which ends it.
//   - Outbound, it follows the frame boundaries of what x/net writes, so
//     that a frame of its own (a GOAWAY, a PING) goes out between two of
//     x/net's frames, never inside one, and after x/net's SETTINGS (the
//     server's connection preface).
//   - At a drain it sends RFC 9113 §6.8's graceful GOAWAY: a GOAWAY with
//     stream id 2^31-1 and a PING; once the PING's ACK is back (every
//     stream the client opened before it has then been read), the final
//     GOAWAY with the real last stream id (goAwayGracefully).
//
// x/net reads a frame's header and payload with separate, small reads
// from the connection; the guard serves them from a small read-ahead
// buffer (h2ReadAheadSize), so it sees the frames a little before x/net
// processes them, in order: it charges them as they arrive, and a stream's
// handler can wait until x/net has caught up with what had arrived when
// it started (awaitProcessed, for Rapid Reset).

// statH2Calm counts the HTTP/2 connections cut with a GOAWAY
// ENHANCE_YOUR_CALM by the guard.
const statH2Calm = "downstream_cx_http2_calm_total"

// Per-connection budgets. Each frame that carries no request costs one
// token; tokens come back at a fixed rate up to the burst. Legitimate
// clients send a handful of these frames per connection (a SETTINGS and
// its ACK, a WINDOW_UPDATE for the connection window, a keep-alive PING
// now and then, a few PRIORITY frames); a client that answers the data it
// receives with WINDOW_UPDATEs or PINGs (gRPC's BDP estimation) earns
// h2ControlPerFrameSent tokens for each DATA or HEADERS frame the server
// sends, so that the bound follows the work the connection does. nginx
// closes a SETTINGS flood after ~45 k frames; these cut one after ~1 k.
const (
	h2ControlBurst        = 1000
	h2ControlPerSecond    = 100
	h2ControlPerFrameSent = 2
	// A client may cancel every stream it has open at once (a browser
	// leaving a page): the reset burst is twice x/net's 250 concurrent
	// streams; past it, resets are Rapid Reset (CVE-2023-44487).
	h2ResetBurst     = 500
	h2ResetPerSecond = 50
)

const (
	// h2CalmWriteWait bounds the wait for a calm GOAWAY to go out (x/net
	// may be in the middle of a write to a client that does not read).
	h2CalmWriteWait = time.Second
	// After a calm GOAWAY the socket is half-closed and what the client
	// still sends is read and dropped, for at most h2CalmLinger or
	// h2CalmLingerBytes: closing a socket with unread bytes resets it,
	// and a reset can destroy the GOAWAY before the client reads it.
	h2CalmLinger      = time.Second
	h2CalmLingerBytes = 1 << 20
	// h2ResetCheckWait bounds a stream's wait for x/net to process the
	// frames that arrived with its request (awaitProcessed).
	h2ResetCheckWait = 250 * time.Millisecond
	// h2FirstRequestWait bounds the wait of a drain's GOAWAY for the first
	// request of a connection that has not sent one (drainGoAway); well
	// within drainIdleGrace, after which the drain closes it when idle.
	h2FirstRequestWait = 250 * time.Millisecond
	// h2GoAwayPingWait bounds the graceful GOAWAY's wait for the PING's
	// ACK: a client that does not answer gets the final GOAWAY then.
	h2GoAwayPingWait = time.Second
)

// h2GoAwayPingData is the graceful GOAWAY's PING payload: its ACK is the
// guard's to see (x/net ignores an ACK of a PING it did not send).
var h2GoAwayPingData = [8]byte{'h', 'p', 'g', 'o', 'a', 'w', 'a', 'y'}

// errH2Calm is the read error x/net gets after a calm GOAWAY.
var errH2Calm = errors.New("HTTP/2 connection cut with GOAWAY ENHANCE_YOUR_CALM")

// h2Budget is a token bucket, touched by one goroutine (x/net's reader).
// Time is read only when the bucket runs empty.
type h2Budget struct {
	burst, perSecond int64
	perFrameSent     int64
	tokens           int64
	refilled         int64  // monotime of the last refill by time
	credited         uint64 // frames sent already turned into tokens
}

func newH2Budget(burst, perSecond, perFrameSent int64) h2Budget {
	return h2Budget{burst: burst, perSecond: perSecond, perFrameSent: perFrameSent, tokens: burst, refilled: monotime()}
}

// take spends a token; false: the budget is exhausted. sent is the count
// of DATA and HEADERS frames the server has written so far.
func (b *h2Budget) take(sent uint64) bool {
	if b.tokens > 0 {
		b.tokens--
		return true
	}
	now := monotime()
	add := (now - b.refilled) * b.perSecond / int64(time.Second)
	if add >= b.burst {
		add, b.refilled = b.burst, now
	} else if add > 0 {
		b.refilled += add * int64(time.Second) / b.perSecond
	}
	add += int64(sent-b.credited) * b.perFrameSent
	b.credited = sent
	b.tokens = min(b.burst, add)
	if b.tokens > 0 {
		b.tokens--
		return true
	}
	return false
}

// h2FrameTracker follows frame boundaries in a byte stream.
type h2FrameTracker struct {
	hdr  [9]byte
	hdrN int    // header bytes of the current frame seen
	left uint32 // payload bytes of the current frame still to come
}

func (t *h2FrameTracker) atBoundary() bool { return t.hdrN == 0 && t.left == 0 }

// header decodes a complete frame header.
func (t *h2FrameTracker) header() (length uint32, typ http2.FrameType, flags http2.Flags, stream uint32) {
	h := &t.hdr
	return uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2]), http2.FrameType(h[3]), http2.Flags(h[4]),
		binary.BigEndian.Uint32(h[5:]) & (1<<31 - 1)
}

// h2Inbound is the client's side of the connection: x/net's reader
// goroutine's only.
type h2Inbound struct {
	h2FrameTracker
	preface int // client preface bytes still to skip
	length  uint32
	typ     http2.FrameType
	flags   http2.Flags
	stream  uint32
	head    [8]byte // the first payload bytes of the current frame
	headN   int
	// lastStream is the highest stream a HEADERS frame opened; passed,
	// its value once x/net was handed the bytes (the last stream x/net
	// may have processed, for a GOAWAY).
	lastStream, passed uint32
}

// partial is how many bytes of an incomplete frame have arrived.
func (in *h2Inbound) partial() int64 {
	switch {
	case in.hdrN > 0:
		return int64(in.hdrN)
	case in.left > 0:
		return int64(len(in.hdr)) + int64(in.length-in.left)
	}
	return 0
}

// h2Guard guards one HTTP/2 connection (see the top of the file).
type h2Guard struct {
	conn net.Conn     // what x/net reads and writes: the TLS connection, or the socket
	tcp  *net.TCPConn // the socket, for the FIN after a calm GOAWAY
	cc   *clientConn  // for its idle mark and its stats

	// The read side: x/net's reader goroutine only.
	in      h2Inbound
	control h2Budget
	resets  h2Budget
	calmErr error // once set, every Read returns it
	// rbuf[rr:rw] is read from the connection and not yet x/net's: the
	// HTTP/1.1 path's bytes at first, then what a read ahead brought.
	// A pooled buffer, held only while bytes wait in it: an idle
	// connection's x/net reader waits in a read into its own 9 bytes.
	rbuf      []byte
	pooled    bool
	rr, rw    int
	readAhead bool // the last read filled x/net's buffer: more is likely there
	// calmPending: the HTTP/1.1 path's bytes already exhausted a budget.
	calmPending string
	// delivered follows the frames handed to x/net, to know which of
	// them it has processed (x/net asks for the next frame's header
	// only once the previous frame is processed).
	delivered            h2FrameTracker
	deliveredPreface     int
	arrivedN, deliveredN int64

	// arrived is the offset of the last frame boundary read from the
	// connection; processed, that of the last boundary x/net has asked
	// to read past (every frame before it processed). A stream's
	// handler waits until processed reaches the arrived of its start
	// (awaitProcessed): a reset the client sent with the request, or
	// right after it, has then cancelled the request's context.
	arrived, processed atomic.Int64
	waiting            atomic.Int32
	progressMu         sync.Mutex // guards progress
	progress           chan struct{}

	// sent counts the DATA and HEADERS frames written: control credit.
	sent atomic.Uint64

	mu       sync.Mutex // guards the fields below, and is held across every write to conn
	out      h2FrameTracker
	started  bool   // x/net has written its first frame (SETTINGS)
	pending  []byte // frames of the guard's own, written at the next boundary
	finAfter bool   // pending ends with a GOAWAY after which nothing more goes out
	waiters  []chan struct{}
	outDone  bool // FIN sent (or the connection failed): writes are dropped
	// deadlineTouched: a write of the guard's own changed conn's write
	// deadline, which x/net set before the Write waiting for mu.
	deadlineTouched bool
	writeTimeout    time.Duration

	// The graceful GOAWAY: goingAway once its first half is queued; the
	// final GOAWAY goes once, at the PING's ACK or at finalTimer, with
	// lastStream (the highest stream a HEADERS frame read opened).
	goAwayOnce sync.Once
	goingAway  atomic.Bool
	finalOnce  sync.Once
	finalTimer *time.Timer // guarded by goAwayOnce
	lastStream atomic.Uint32
	// awaitFirst: the drain asked for the GOAWAY before the client sent
	// its first request; it goes with that request (firstTimer: or
	// after h2FirstRequestWait).
	awaitFirst     atomic.Bool
	firstTimerOnce sync.Once
	firstTimer     *time.Timer   // guarded by firstTimerOnce
	gone           chan struct{} // closed when the connection's serving ends
}

func newH2Guard(cc *clientConn) *h2Guard {
	return &h2Guard{
		conn:             cc.c,
		tcp:              cc.tcp,
		cc:               cc,
		in:               h2Inbound{preface: len(http2.ClientPreface)},
		deliveredPreface: len(http2.ClientPreface),
		control:          newH2Budget(h2ControlBurst, h2ControlPerSecond, h2ControlPerFrameSent),
		resets:           newH2Budget(h2ResetBurst, h2ResetPerSecond, 0),
		writeTimeout:     cc.settings.writeTimeout,
		gone:             make(chan struct{}),
	}
}

// h2ReadAheadSize is the guard's read-ahead buffer: room for a hundred
// small frames (a request's HEADERS and its RST_STREAM are about 40
// bytes), so that a reset sent with its request is read before the
// request goes upstream. x/net's reads of a larger payload go straight
// into its own buffer.
const h2ReadAheadSize = 4 << 10

type h2ReadAheadBuf [h2ReadAheadSize]byte

var h2ReadAheadBufs = sync.Pool{New: func() any { return new(h2ReadAheadBuf) }}

// read is x/net's Read: bytes waiting in rbuf first, then a read ahead
// into a pooled buffer when more is likely there, else a read into p.
func (g *h2Guard) read(p []byte) (int, error) {
	if g.calmErr != nil {
		return 0, g.calmErr
	}
	if g.calmPending != "" {
		return 0, g.calm(g.calmPending)
	}
	g.noteRead()
	if g.rr == g.rw {
		g.releaseReadBuf()
		var n int
		var err error
		if g.readAhead && len(p) < h2ReadAheadSize {
			g.rbuf, g.pooled, g.rr = h2ReadAheadBufs.Get().(*h2ReadAheadBuf)[:], true, 0
			g.rw, err = g.conn.Read(g.rbuf)
			n = g.rw
		} else {
			n, err = g.conn.Read(p)
			g.readAhead = n == len(p)
		}
		if n > 0 {
			g.cc.st.rxBytes.Add(uint64(n))
			var buf []byte
			if g.rbuf != nil {
				buf = g.rbuf[:g.rw]
			} else {
				buf = p[:n]
			}
			if reason := g.received(buf); reason != "" {
				g.releaseReadBuf()
				return 0, g.calm(reason)
			}
		}
		if g.rbuf == nil {
			g.deliver(p[:n])
			return n, err
		}
		if g.rw == 0 {
			g.releaseReadBuf()
			return 0, err
		}
		g.readAhead = true
	}
	n := copy(p, g.rbuf[g.rr:g.rw])
	g.rr += n
	if g.rr == g.rw {
		// Drained: the next read waits in x/net's buffer, not in a
		// pooled one.
		g.releaseReadBuf()
		g.readAhead = false
	}
	g.deliver(p[:n])
	return n, nil
}

// setPending makes the HTTP/1.1 path's bytes (a copy) the first x/net
// reads.
func (g *h2Guard) setPending(b []byte) {
	g.rbuf, g.rr, g.rw = b, 0, len(b)
	if reason := g.received(b); reason != "" {
		g.calmPending = reason
	}
}

func (g *h2Guard) releaseReadBuf() {
	if g.pooled {
		h2ReadAheadBufs.Put((*h2ReadAheadBuf)(g.rbuf))
	}
	g.rbuf, g.pooled, g.rr, g.rw = nil, false, 0, 0
}

// deliver follows the bytes handed to x/net.
func (g *h2Guard) deliver(p []byte) {
	g.deliveredN += int64(len(p))
	if k := min(g.deliveredPreface, len(p)); k > 0 {
		g.deliveredPreface -= k
		p = p[k:]
	}
	t := &g.delivered
	for len(p) > 0 {
		if t.left > 0 {
			k := int(min(uint32(len(p)), t.left))
			t.left -= uint32(k)
			p = p[k:]
			continue
		}
		k := copy(t.hdr[t.hdrN:], p)
		t.hdrN += k
		p = p[k:]
		if t.hdrN < len(t.hdr) {
			return
		}
		length, _, _, _ := t.header()
		t.hdrN, t.left = 0, length
	}
}

// noteRead is called as x/net asks for more: at a frame boundary of what
// it was handed, every frame before is processed.
func (g *h2Guard) noteRead() {
	if g.deliveredPreface > 0 || !g.delivered.atBoundary() {
		return
	}
	g.processed.Store(g.deliveredN)
	if g.waiting.Load() > 0 {
		g.progressMu.Lock()
		if g.progress != nil {
			close(g.progress)
			g.progress = nil
		}
		g.progressMu.Unlock()
	}
}

// awaitProcessed waits (at most h2ResetCheckWait) until x/net has
// processed every frame read from the connection so far.
func (g *h2Guard) awaitProcessed(done <-chan struct{}) {
	target := g.arrived.Load()
	if g.processed.Load() >= target {
		return
	}
	timer := time.NewTimer(h2ResetCheckWait)
	defer timer.Stop()
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	for {
		g.progressMu.Lock()
		if g.processed.Load() >= target {
			g.progressMu.Unlock()
			return
		}
		if g.progress == nil {
			g.progress = make(chan struct{})
		}
		ch := g.progress
		g.progressMu.Unlock()
		select {
		case <-ch:
		case <-done:
			return
		case <-g.gone:
			return
		case <-timer.C:
			return
		}
	}
}

// received follows the bytes read from the connection; a reason
// (non-empty) says which budget they exhausted.
func (g *h2Guard) received(p []byte) string {
	in := &g.in
	n0 := len(p)
	for len(p) > 0 {
		if in.preface > 0 {
			k := min(in.preface, len(p))
			in.preface -= k
			p = p[k:]
			continue
		}
		if in.left == 0 && in.hdrN < len(in.hdr) {
			k := copy(in.hdr[in.hdrN:], p)
			in.hdrN += k
			p = p[k:]
			if in.hdrN < len(in.hdr) {
				break
			}
			in.length, in.typ, in.flags, in.stream = in.header()
			in.left, in.headN = in.length, 0
		}
		k := int(min(uint32(len(p)), in.left))
		if in.headN < len(in.head) {
			in.headN += copy(in.head[in.headN:], p[:k])
		}
		in.left -= uint32(k)
		p = p[k:]
		if in.left > 0 {
			break
		}
		in.hdrN = 0
		if reason := g.onFrame(); reason != "" {
			return reason
		}
	}
	in.passed = in.lastStream
	g.arrivedN += int64(n0)
	// The last frame boundary: what ends a partial frame is not here yet.
	g.arrived.Store(g.arrivedN - in.partial())
	return ""
}

// onFrame charges a complete inbound frame to its budget.
func (g *h2Guard) onFrame() string {
	in := &g.in
	switch in.typ {
	case http2.FrameHeaders:
		if in.stream > in.lastStream {
			in.lastStream = in.stream
			g.lastStream.Store(in.stream)
			if g.awaitFirst.Load() {
				g.goAwayGracefully()
			}
		}
		return ""
	case http2.FrameContinuation:
		return "" // x/net bounds header blocks and their CONTINUATIONs
	case http2.FrameData:
		data := in.length
		if in.flags.Has(http2.FlagDataPadded) && in.length > 0 {
			if pad := uint32(in.head[0]); pad+1 <= in.length {
				data = in.length - 1 - pad
			} else {
				data = 0
			}
		}
		if data > 0 || in.flags.Has(http2.FlagDataEndStream) {
			return ""
		}
		return g.spendControl("empty DATA")
	case http2.FrameRSTStream:
		if !g.resets.take(0) {
			return "RST_STREAM"
		}
		return ""
	case http2.FramePing:
		if in.flags.Has(http2.FlagPingAck) && in.length == 8 && in.head == h2GoAwayPingData && g.goingAway.Load() {
			// Every stream the client opened before it is read.
			g.finalGoAway()
			return ""
		}
		return g.spendControl("PING")
	case http2.FrameSettings:
		return g.spendControl("SETTINGS")
	case http2.FrameWindowUpdate:
		return g.spendControl("WINDOW_UPDATE")
	case http2.FramePriority:
		return g.spendControl("PRIORITY")
	default:
		return g.spendControl("frames of type " + in.typ.String())
	}
}

func (g *h2Guard) spendControl(what string) string {
	if g.control.take(g.sent.Load()) {
		return ""
	}
	return what
}

// calm ends the connection for a client past a budget: a GOAWAY
// ENHANCE_YOUR_CALM (with the last stream x/net may have processed), a
// FIN, a bounded linger, and the error that x/net's read returns.
func (g *h2Guard) calm(reason string) error {
	cc := g.cc
	cc.st.h2Calm.Inc()
	if log := cc.m.log; log.IsDebug() {
		log.Debug("HTTP/2 client past its frame budget: GOAWAY ENHANCE_YOUR_CALM", "frames", reason, "client", string(cc.clientIP))
	}
	done := g.queue(h2GoAwayFrame(nil, g.in.passed, http2.ErrCodeEnhanceYourCalm), true)
	t := time.NewTimer(h2CalmWriteWait)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()
	g.linger()
	g.calmErr = fmt.Errorf("workers: HTTP/2 client sent too many %s frames: %w", reason, errH2Calm)
	return g.calmErr
}

// linger reads and drops what the client still sends, bounded in time
// and bytes.
func (g *h2Guard) linger() {
	g.conn.SetReadDeadline(time.Now().Add(h2CalmLinger))
	buf := getBuf()
	defer putBuf(buf)
	for n := 0; n < h2CalmLingerBytes; {
		k, err := g.conn.Read(buf)
		n += k
		if err != nil {
			return
		}
	}
}

// write is x/net's Write: p goes out whole, or split at a frame boundary
// where frames of the guard's own wait.
func (g *h2Guard) write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deadlineTouched {
		g.deadlineTouched = false
		g.restoreDeadlineLocked()
	}
	total := 0
	for {
		if len(g.pending) > 0 && g.started && g.out.atBoundary() {
			g.flushPendingLocked()
		}
		if g.outDone {
			return total + len(p), nil
		}
		if len(p) == 0 {
			return total, nil
		}
		k, frames := g.advanceOut(p, len(g.pending) > 0, &g.started)
		if frames > 0 {
			g.sent.Add(frames)
		}
		n, err := g.conn.Write(p[:k])
		total += n
		if err != nil {
			return total, err
		}
		p = p[k:]
	}
}

// advanceOut follows p through the outbound frames: with stop, only up
// to the first frame boundary in it. It returns how many bytes it
// followed, and the DATA and HEADERS frames whose header it completed;
// started is set once any frame header is complete.
func (g *h2Guard) advanceOut(p []byte, stop bool, started *bool) (int, uint64) {
	t := &g.out
	n := 0
	var frames uint64
	for n < len(p) {
		if t.left > 0 {
			k := int(min(uint32(len(p)-n), t.left))
			t.left -= uint32(k)
			n += k
			if t.left == 0 && stop {
				break
			}
			continue
		}
		c := copy(t.hdr[t.hdrN:], p[n:])
		t.hdrN += c
		n += c
		if t.hdrN < len(t.hdr) {
			break
		}
		length, typ, _, _ := t.header()
		t.hdrN, t.left = 0, length
		*started = true
		// Not SETTINGS or PING: their ACKs answer the frames they
		// would earn credit for.
		if typ == http2.FrameData || typ == http2.FrameHeaders {
			frames++
		}
		if length == 0 && stop {
			break
		}
	}
	return n, frames
}

// queue sends frames of the guard's own at the next frame boundary of
// x/net's output; fin: nothing goes out after them (the socket gets a
// FIN). The channel is closed once they are out, or dropped.
func (g *h2Guard) queue(frames []byte, fin bool) <-chan struct{} {
	done := make(chan struct{})
	g.mu.Lock()
	if g.outDone {
		g.mu.Unlock()
		close(done)
		return done
	}
	g.pending = append(g.pending, frames...)
	g.finAfter = g.finAfter || fin
	g.waiters = append(g.waiters, done)
	g.mu.Unlock()
	// x/net may be idle: write them now if at a boundary. Not on the
	// caller's goroutine: a Write in progress to a client that does not
	// read holds mu until write_timeout, or the connection's end.
	go func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.pending) == 0 || !g.started || !g.out.atBoundary() || g.outDone {
			return // a Write of x/net's sends them at its next boundary
		}
		g.conn.SetWriteDeadline(time.Now().Add(h2CalmWriteWait))
		g.flushPendingLocked()
		g.restoreDeadlineLocked()
		g.deadlineTouched = true
	}()
	return done
}

// flushPendingLocked writes the guard's frames (at a frame boundary).
func (g *h2Guard) flushPendingLocked() {
	_, err := g.conn.Write(g.pending)
	g.pending = g.pending[:0]
	if g.finAfter || err != nil {
		g.outDone = true
		if g.finAfter {
			g.tcp.CloseWrite()
		}
	}
	for _, w := range g.waiters {
		close(w)
	}
	g.waiters = g.waiters[:0]
}

// restoreDeadlineLocked sets the write deadline x/net's byte timeout
// (write_timeout) would have set for a write starting now.
func (g *h2Guard) restoreDeadlineLocked() {
	var d time.Time
	if g.writeTimeout > 0 {
		d = time.Now().Add(g.writeTimeout)
	}
	g.conn.SetWriteDeadline(d)
}

// ended is called when the connection's serving ends: waiters stop.
func (g *h2Guard) ended() {
	close(g.gone)
	g.goAwayOnce.Do(func() {}) // no graceful GOAWAY from now on
	if g.finalTimer != nil {
		g.finalTimer.Stop()
	}
	g.firstTimerOnce.Do(func() {})
	if g.firstTimer != nil {
		g.firstTimer.Stop()
	}
	g.mu.Lock()
	g.outDone = true
	for _, w := range g.waiters {
		close(w)
	}
	g.waiters = nil
	g.mu.Unlock()
}

// drainGoAway is the drain's GOAWAY for the connection: the graceful one
// at once, or, for a connection whose client has not sent a request yet,
// with its first request (or after h2FirstRequestWait). A client that has
// just opened a connection (often one whose TLS handshake ended after the
// drain began) is about to send on it: a GOAWAY, even the graceful one,
// forbids it the streams it has not sent yet, and a client that does not
// retry them elsewhere (h2load) fails them. The first requests, and those
// sent with them, are served; the GOAWAY then follows.
func (g *h2Guard) drainGoAway() {
	if g.lastStream.Load() == 0 {
		g.awaitFirst.Store(true)
		// A request read between the load and the store has seen
		// awaitFirst false: look again.
		if g.lastStream.Load() == 0 {
			g.firstTimerOnce.Do(func() { g.firstTimer = time.AfterFunc(h2FirstRequestWait, g.goAwayGracefully) })
			g.restartIdle()
			return
		}
	}
	g.goAwayGracefully()
}

// goAwayGracefully starts RFC 9113 §6.8's graceful GOAWAY, once, without
// waiting: a GOAWAY with stream id 2^31-1 (no new streams, please; those
// in flight are still welcome) and a PING; the final GOAWAY follows at the
// PING's ACK (finalGoAway), or after h2GoAwayPingWait for a client that
// does not answer. An idle connection's idle mark starts again now, so
// that the drain does not close it before the client has heard the GOAWAY.
//
// The final GOAWAY is the guard's too, not x/net's graceful shutdown:
// that one is per http.Server (base.Shutdown), and would reach the
// connections whose PING is not answered yet, late ones (their TLS
// handshake done after the drain began) included, with the last stream
// x/net had read, refusing the requests their clients were sending. x/net
// does not learn of the GOAWAY: it serves the streams it reads, and the
// drain closes the connection once idle (drainIdleGrace), or at its
// deadline.
func (g *h2Guard) goAwayGracefully() {
	g.goAwayOnce.Do(func() {
		b := h2GoAwayFrame(nil, 1<<31-1, http2.ErrCodeNo)
		b = h2PingFrame(b, h2GoAwayPingData)
		g.goingAway.Store(true)
		g.queue(b, false)
		g.finalTimer = time.AfterFunc(h2GoAwayPingWait, g.finalGoAway)
		g.restartIdle()
	})
}

// finalGoAway sends the graceful GOAWAY's second half, once: the last
// stream the client opened.
func (g *h2Guard) finalGoAway() {
	g.finalOnce.Do(func() {
		g.queue(h2GoAwayFrame(nil, g.lastStream.Load(), http2.ErrCodeNo), false)
		g.restartIdle()
	})
}

// restartIdle starts an idle connection's idle mark again.
func (g *h2Guard) restartIdle() {
	if since := g.cc.idleSince.Load(); since != 0 {
		g.cc.idleSince.CompareAndSwap(since, max(monotime(), 1))
	}
}

func h2GoAwayFrame(b []byte, lastStream uint32, code http2.ErrCode) []byte {
	b = append(b, 0, 0, 8, byte(http2.FrameGoAway), 0, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, lastStream&(1<<31-1))
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

func h2PingFrame(b []byte, data [8]byte) []byte {
	b = append(b, 0, 0, 8, byte(http2.FramePing), 0, 0, 0, 0, 0)
	return append(b, data[:]...)
}

// h2Guards is the set of a Manager's HTTP/2 connections being served:
// touched once when a connection starts and once when it ends, never per
// request.
type h2Guards struct {
	mu sync.Mutex // guards m
	m  map[*h2Guard]struct{}
}

func (s *h2Guards) add(g *h2Guard) {
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[*h2Guard]struct{})
	}
	s.m[g] = struct{}{}
	s.mu.Unlock()
}

func (s *h2Guards) remove(g *h2Guard) {
	s.mu.Lock()
	delete(s.m, g)
	s.mu.Unlock()
}

func (s *h2Guards) all() []*h2Guard {
	s.mu.Lock()
	defer s.mu.Unlock()
	gs := make([]*h2Guard, 0, len(s.m))
	for g := range s.m {
		gs = append(gs, g)
	}
	return gs
}
