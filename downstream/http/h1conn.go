package httpfront

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/internal/rawsock"
)

// The HTTP/1.1 data path: one goroutine per client connection, the request
// head parsed in place in the connection's read buffer (http1), one
// write per upstream request and per response head, upstream connections
// from the worker's pool (upstream.Conn). net/http stays off this path: it
// costs three goroutines, ~90 allocations and five reads per exchange.

// Buffers. A connection holds a read buffer only while a request is in
// progress or pipelined bytes wait in it; an idle plaintext keep-alive
// connection holds none (it waits for readability first). An idle TLS one
// holds what crypto/tls keeps between records (see waitTLSRecord). The
// buffer starts small (SmallBufSize) and grows to IOBufSize for a large
// head or a body (h1state.go).
const (
	IOBufSize = 32 << 10
	// deadlineSlack: a deadline is moved only when it is this far from
	// where it should be, so that a busy keep-alive connection resets its
	// timers about once a second rather than on every request; an eighth
	// of a timeout shorter than 8s (DeadlineSlackFor).
	deadlineSlack = time.Second
	// ParkIdleAfter is the park grace: a plaintext keep-alive connection
	// of a listener with park_idle_connections parks in its worker's idle
	// poller once idle this long (the worker's park sweep asks it, every
	// ParkIdleAfter: so between one and two of them after its last
	// response). A client under keep-alive load sends its next request
	// within a round trip, microseconds to milliseconds, and never
	// parks; one with think time (a browser, a poller) or none (a pool
	// kept warm) parks within half a second and costs a parked
	// connection's memory for the rest of its idle_timeout (60s by
	// default). Longer would keep more stacks after a burst for no gain;
	// shorter would make a client pacing itself at a few requests per
	// second park on each, which is cheap at that rate (two system
	// calls and a hand-over per request) but gains nothing either. Not
	// a key: no workload found where another value pays.
	ParkIdleAfter = 250 * time.Millisecond
)

// Conn is one HTTP client connection. Its goroutine owns every
// field but the atomics, which the drain reads.
type Conn struct {
	// c is what requests are read from and responses written to: the
	// socket itself, or a tls.Conn over it.
	c net.Conn
	// tcp is the socket, held raw (rawsock: it joins the runtime's
	// poller only once a read or write has to wait).
	tcp *rawsock.Conn
	raw syscall.RawConn
	// tls is c when the listener terminates TLS, else nil; sni is the
	// ClientHello's server name, for routes with server_name, stored
	// once the handshake is done.
	tls       *tls.Conn
	sni       string
	handshook bool // the TLS handshake completed

	// l is the listener as the connection's worker serves it; st its
	// stats (l.Stats).
	l        *Listener
	st       *Stats
	settings *Settings // the listener's HTTP/1.1 settings, compiled with the snapshot (not a config)

	clientIP []byte // for X-Forwarded-For, formatted once

	// Access logging (accesslog.go): the listener's logs (nil: none),
	// the record being filled, and what the request's handling leaves
	// for it.
	logs      []*accesslog.Logger
	rec       *accesslog.Record
	sentBytes int64 // bytes written to the client, all requests
	outcome         // the request's: status, last endpoint, retries

	closed atomic.Bool
	// idleSince is when the connection last became idle between requests
	// (monotime), or 0 while it is new, busy or tunnelling.
	idleSince atomic.Int64
	// ended is when the last request ended (handle), for the idle wait
	// that follows it, which takes it as its start instead of reading
	// the clock again (zero once taken); waitStart is that start
	// (monotime), for readable.
	ended     time.Time
	waitStart int64
	// heldSince and heldBytes: since which overload pass (plus one; 0:
	// none) the connection holds buffers, and how many bytes of them;
	// requestsStarted: how many requests it has begun. For
	// reset_connections (the worker's ResetBiggest, through HeldBuffers).
	heldSince, heldBytes, requestsStarted atomic.Int64

	// rawFn is the socket's RawConn callback (a method value, made once
	// per connection: a closure per call would be an allocation per
	// request); it does rawOp: the idle wait's readable, or a write of
	// rawBuf (rawN bytes of it written so far, rawErr the write's
	// error). waited says whether the idle wait has already peeked.
	rawFn  func(fd uintptr) bool
	rawOp  rawOp
	rawBuf []byte
	rawN   int
	rawErr error
	waited bool
	// closeLast: the response being written is the connection's last and
	// goes in one write (writeLast); rawMore: writeStep sends with
	// MSG_MORE (writeBeforeClose).
	closeLast, rawMore bool
	// headArmed: headReadStep armed the header timeout.
	headArmed bool
	// spuriousWake: readHead found nothing after the idle wait woke
	// (readAfterWake); the connection is idle again.
	spuriousWake bool
	// pending is a keep-alive response's last bytes, left by writeLast
	// for the idle wait to write (nil: none); deferLast says whether the
	// response being sent may leave them; pendingFailed is that write's
	// failure, which ends the connection.
	pending       []byte
	deferLast     bool
	pendingFailed bool
	// idleByte is where a TLS connection's idle wait reads the first
	// byte of the next request (waitTLSRecord).
	idleByte [1]byte

	// parking is the connection's state in the worker's idle poller
	// (idlepoll_linux.go), made at its first park: nil until then (a
	// connection that is never idle for the park grace pays one
	// pointer for it). idleWaitState says whether its goroutine waits
	// where the park sweep may ask it to park (AskToPark).
	parking       atomic.Pointer[parking]
	idleWaitState atomic.Int32

	rbuf []byte // nil while idle; SmallBufSize until a head or body needs more (h1state.go)
	r, w int    // rbuf[r:w] is read and not yet consumed
	ex   *h1State
	held atomic.Int64 // bytes of buffers and state held now (BufferBytes)

	readDeadline  time.Time
	writeDeadline time.Time

	// readDeadlineMoves and writeDeadlineMoves count setReadDeadline's
	// and setWriteDeadline's moves, spuriousWakes the idle waits that
	// woke with nothing to read (tests read them).
	readDeadlineMoves, writeDeadlineMoves, spuriousWakes int
}

var _ io.Closer = (*Conn)(nil)

// NewConn is the connection c, accepted on l's socket, ready to be
// served (Serve); it starts with the listener's settings, or their shrunk
// copy while the overload manager asks for it.
func NewConn(l *Listener, c *rawsock.Conn) *Conn {
	cc := &Conn{c: c, tcp: c, l: l, st: l.Stats, settings: l.Worker.overloadSettings(l.Settings, l.Index)}
	if l.TLS != nil {
		cc.tls = tls.Server(c, l.TLS)
		cc.c = cc.tls
	}
	cc.raw, _ = c.SyscallConn()
	cc.rawFn = cc.rawStep
	cc.clientIP = c.RemoteAddrPort().Addr().Unmap().AppendTo(nil)
	if logs := l.AccessLogs; len(logs) > 0 {
		cc.logs, cc.rec = logs, new(accesslog.Record)
	}
	return cc
}

// Close closes the client connection (a drain, or the connection's end).
// Safe to call from any goroutine, more than once. It closes the socket
// itself, never blocking: a TLS close_notify is sent only by the
// connection's own goroutine (closeAtEnd), as tls.Conn.Close may wait up to
// 5s to write it.
func (cc *Conn) Close() error {
	if cc.closed.CompareAndSwap(false, true) {
		cc.l.Host.Closed(cc) // its set, its connection slot, its gauges: once, here
	}
	err := cc.tcp.Close()
	// A parked connection has no goroutine to see the close: it gets one,
	// whose read fails, and ends as any connection does.
	cc.l.Worker.idle.unpark(cc)
	return err
}

// IdleFor reports how long the connection has been idle between
// requests, or 0.
func (cc *Conn) IdleFor(now int64) time.Duration {
	since := cc.idleSince.Load()
	if since == 0 {
		return 0
	}
	return time.Duration(now - since)
}

// Serve runs the connection until it closes or parks. The goroutine of
// a connection that parks becomes a resumer of the worker's idle poller,
// or ends.
func (cc *Conn) Serve() {
	if cc.start() && cc.serveRequests() {
		cc.l.Worker.idle.joinResumers()
		return
	}
	cc.finish()
}

// resume runs a parked connection again, on a resumer goroutine: its
// socket is readable, or it was closed (Close, the idle timer).
func (cc *Conn) resume() {
	cc.idleSince.Store(0)
	if !cc.closed.Load() && cc.serveRequests() {
		return
	}
	cc.finish()
}

// finish ends the connection, on its goroutine.
func (cc *Conn) finish() {
	cc.flushPending()
	cc.endState()
	if pk := cc.parking.Load(); pk != nil {
		pk.idleTimer.Stop()
		cc.l.Worker.idle.release(pk)
	}
	cc.closeAtEnd()
	cc.l.ConnWG.Done()
}

// start does what comes before the first request: the TLS handshake, and
// HTTP/2 when ALPN chose it. false: the connection is over.
func (cc *Conn) start() bool {
	if cc.tls != nil {
		if !cc.handshake() {
			return false
		}
		if cc.tls.ConnectionState().NegotiatedProtocol == config.ALPNHTTP2 {
			serveHTTP2(cc)
			return false
		}
	}
	return true
}

// serveRequests serves HTTP/1.1 requests until the connection is over
// (false) or parks (true: another goroutine owns it now).
func (cc *Conn) serveRequests() bool {
	// A new connection reads its first request straight away: its client
	// has just connected to send it, and is most often sent already, so
	// a peek first would be one more syscall per connection. Until then
	// it holds a buffer, for at most header_timeout (and max_connections
	// bounds how many do). A resumed one was woken because it is
	// readable.
	fresh := true
	for {
		woke := false // the idle wait saw the next request's bytes come
		if cc.r == cc.w && !fresh {
			ok, parked := cc.idleWait()
			if parked {
				return true
			}
			if !ok {
				return false
			}
			woke = true
		} else if !cc.flushPending() {
			return false
		}
		fresh = false
		cc.takeState()
		if !cc.readHead(woke) {
			if cc.spuriousWake {
				// Nothing came: idle again (the buffer goes back).
				cc.spuriousWake = false
				continue
			}
			return false
		}
		if !cc.handle() {
			return false
		}
	}
}

// idleWait waits, holding no buffer, for the next request, in its own
// goroutine. A plaintext connection of a listener that parks idle
// connections parks in the worker's idle poller once it has been idle
// for the worker's park grace (parked: another goroutine owns the
// connection now): the worker's park sweep asks it to (AskToPark), so a
// client that sends its next request within the grace never touches the
// poller. ok false: the connection is over.
func (cc *Conn) idleWait() (ok, parked bool) {
	if cc.pending == nil || cc.tls != nil {
		cc.flushPending()
		cc.releaseState()
	} // else waitReadable writes it, then releases the state
	if cc.tls != nil {
		return cc.waitTLSRecord(), false
	}
	ok, asked := cc.waitReadable(cc.settings.ParkIdle)
	if !asked {
		return ok, false
	}
	// The poller's arm checks readiness itself: a request sent as the
	// sweep asked is seen there (parkWoken, or a wake at once).
	switch cc.park() {
	case parkParked:
		return true, true
	case parkWoken:
		cc.idleSince.Store(0)
		return true, false // readable, or closed: the read tells
	}
	// Not parked (the worker is closing): wait here, not asked again.
	ok, _ = cc.waitReadable(false)
	return ok, false
}

// Conn.idleWaitState values: whether the connection waits idle in its
// goroutine where the park sweep may ask it to park (AskToPark).
const (
	idleWaitNone     int32 = iota // not in a wait that may park
	idleWaitParkable              // waiting in its goroutine; may be asked
	idleWaitAsking                // the sweep is moving its read deadline to the past
	idleWaitAsked                 // asked: the wait ends with that deadline, and the connection parks
)

// pastDeadline is the read deadline by which the park sweep ends a
// parkable wait: any time before now.
var pastDeadline = time.Unix(1, 0)

// ParkDue reports whether the connection waits idle in its goroutine,
// may park, and has been idle for at least grace: what the worker's park
// sweep asks to park. Atomics only.
func (cc *Conn) ParkDue(now int64, grace time.Duration) bool {
	return cc.idleWaitState.Load() == idleWaitParkable && cc.IdleFor(now) >= grace
}

// AskToPark ends the idle wait of a connection that is ParkDue by moving
// its read deadline to the past (RawConn.Read returns, nothing is read):
// its goroutine sees that it was asked, not timed out, puts its own
// deadline back and parks. Safe from any goroutine; a connection that
// has left that wait since (its client sent a request), or is idle for
// less than grace (a new wait since ParkDue), is left alone: false.
func (cc *Conn) AskToPark(grace time.Duration) bool {
	if !cc.idleWaitState.CompareAndSwap(idleWaitParkable, idleWaitAsking) {
		return false
	}
	// The goroutine cannot leave the wait until the state is no longer
	// idleWaitAsking (endParkableWait), so the deadline moved here never
	// lands on a read that follows the wait.
	if cc.IdleFor(Monotime()) < grace {
		cc.idleWaitState.Store(idleWaitParkable)
		return false
	}
	cc.tcp.SetReadDeadline(pastDeadline)
	cc.idleWaitState.Store(idleWaitAsked)
	return true
}

// endParkableWait ends a wait that the sweep may ask to park: true, it
// was asked, and the socket's read deadline is in the past. While the
// sweep is between its two steps (idleWaitAsking, a few instructions
// and a runtime timer update) it yields to it.
func (cc *Conn) endParkableWait() bool {
	for {
		if cc.idleWaitState.CompareAndSwap(idleWaitParkable, idleWaitNone) {
			return false
		}
		if cc.idleWaitState.CompareAndSwap(idleWaitAsked, idleWaitNone) {
			return true
		}
		runtime.Gosched()
	}
}

// parkResult is what a park came to (idlePoller.park).
type parkResult int

const (
	parkFailed parkResult = iota // not parked: wait in the goroutine
	parkParked                   // parked: the goroutine lets go
	parkWoken                    // woken while being armed: read on
)

// parking.state values.
const (
	stateRunning     int32 = iota // a goroutine runs the connection
	stateArming                   // its goroutine is registering it in the poller
	stateWokenArming              // woken or closed during the arm: its goroutine reads on
	stateParked                   // in the poller, no goroutine
)

// parking is a connection's state in its worker's idle poller. state:
// stateParked while the socket waits there and no goroutine runs the
// connection; whoever turns it back to stateRunning owns the connection.
// token and slot (index plus one; 0: none) are its place in the poller;
// added: the socket is in the poller's epoll (re-armed with
// EPOLL_CTL_MOD). The arm* fields are the arm's, for its Control
// callbacks (method values made once: a closure per park would be an
// allocation per keep-alive request).
type parking struct {
	cc                     *Conn
	state                  atomic.Int32
	token                  uint64
	slot                   uint32
	added                  bool
	armOp, armEpfd         int
	armErr                 error
	armOuterFn, armInnerFn func(fd uintptr)
	// idleTimer closes a parked connection at its idle timeout (no read
	// deadline can: nobody reads), armed at most once at a time
	// (timerArmed) and re-armed lazily: a busy keep-alive connection
	// costs it one reset per idle_timeout, not one per request.
	// idleTimeout is the one the parked connection started waiting with,
	// for the timer's goroutine.
	idleTimer   *time.Timer
	timerArmed  atomic.Bool
	idleTimeout atomic.Int64
}

// park gives the idle connection, which holds no buffer, to the worker's
// idle poller (idlePoller.park says what the result means).
func (cc *Conn) park() parkResult {
	pk := cc.parking.Load()
	if pk == nil {
		pk = &parking{cc: cc}
		pk.idleTimer = time.AfterFunc(time.Hour, pk.idleTimerFired)
		pk.idleTimer.Stop()
		cc.parking.Store(pk)
	}
	pk.idleTimeout.Store(int64(cc.settings.IdleTimeout))
	// The socket's read deadline may pass while parked; the next
	// setReadDeadline sets one afresh.
	cc.readDeadline = time.Time{}
	if cc.idleSince.Load() == 0 {
		cc.idleSince.Store(max(Monotime(), 1))
	}
	r := cc.l.Worker.idle.park(pk)
	if r == parkParked {
		// Atomics, immutable fields and the timer only: cc may run
		// elsewhere already.
		cc.st.IdleParked.Inc()
		pk.armIdleTimer()
	}
	return r
}

// armIdleTimer arms the idle timer for the rest of the parked
// connection's idle timeout, unless it is armed already. Safe from any
// goroutine: it reads only atomics and the timer, made before the park.
func (pk *parking) armIdleTimer() {
	d := time.Duration(pk.idleTimeout.Load())
	if d <= 0 || !pk.timerArmed.CompareAndSwap(false, true) {
		return
	}
	pk.idleTimer.Reset(max(d-pk.cc.IdleFor(Monotime()), 0))
}

// idleTimerFired closes the connection if it is still parked and has
// been idle for its whole timeout, or re-arms the timer for the rest (it
// was armed by an earlier park, and the connection was busy since).
// Disarming first, then looking at the state, pairs with park's state
// then arm: one of the two arms it.
func (pk *parking) idleTimerFired() {
	pk.timerArmed.Store(false)
	if pk.state.Load() != stateParked {
		return
	}
	if pk.cc.IdleFor(Monotime()) >= time.Duration(pk.idleTimeout.Load()) {
		pk.cc.Close()
		return
	}
	pk.armIdleTimer()
}

// waitReadable waits, holding no buffer, until the client sends something
// or the idle timeout passes. ok false: the connection is over. parkable:
// the park sweep may end the wait to have the connection park (asked
// true: it did; the connection is still idle, since idleSince, and the
// socket's read deadline is its own again).
func (cc *Conn) waitReadable(parkable bool) (ok, asked bool) {
	now := cc.ended
	cc.ended = time.Time{}
	if now.IsZero() {
		now = time.Now()
	}
	cc.waitStart = max(monotimeOf(now), 1)
	if cc.pending == nil {
		// Else idle once the response is out (readable): a drain
		// closes idle connections.
		cc.idleSince.Store(cc.waitStart)
	}
	cc.setReadDeadlineFrom(now, cc.settings.IdleTimeout)
	cc.waited = false
	cc.pendingFailed = false
	cc.rawOp = rawReadable
	// readable tells a wake from its first look by counting its calls:
	// the socket must be in the poller before the first, or the call
	// after the registration would pass for a wake (rawsock's
	// RawConn.Read retries once it registers).
	if err := cc.tcp.Register(); err != nil {
		return false, false
	}
	if parkable {
		cc.idleWaitState.Store(idleWaitParkable)
	}
	err := cc.raw.Read(cc.rawFn)
	if parkable && cc.endParkableWait() {
		// Once per park, never per request: a busy connection is never
		// asked.
		cc.tcp.SetReadDeadline(cc.readDeadline)
		if err != nil && isTimeout(err) && !cc.pendingFailed &&
			(cc.readDeadline.IsZero() || time.Now().Before(cc.readDeadline)) {
			return true, true // idleSince kept: the parked idle timeout counts from it
		}
	}
	cc.idleSince.Store(0)
	// EOF or an error shows itself to the read that follows.
	return err == nil && !cc.pendingFailed, false
}

// rawOp is what rawStep does.
type rawOp uint8

const (
	rawReadable  rawOp = iota // readable: the idle wait
	rawWrite                  // writeStep: write rawBuf
	rawHeadRead               // headReadStep: read into rbuf[w:]
	rawWokenRead              // readAfterWake: read into rbuf[w:], never wait
)

// rawStep is the socket's RawConn callback: true when done, false to
// wait until the socket is ready (or its deadline passes).
func (cc *Conn) rawStep(fd uintptr) bool {
	switch cc.rawOp {
	case rawWrite:
		return cc.writeStep(fd)
	case rawHeadRead:
		return cc.headReadStep(fd)
	case rawWokenRead:
		n, err := readFD(fd, cc.rbuf[cc.w:])
		cc.rawN, cc.rawErr = n, err
		return true
	}
	return cc.readable(fd)
}

// readable is waitReadable's callback (rawStep). The poller is edge-triggered and RawConn.Read resets its readiness
// before the first call, so bytes that arrived before it would never wake
// a wait: the first call peeks. After a wake the bytes are there (a rare
// spurious wake makes the read that follows wait, holding a buffer).
//
// With a response pending (writeLast), the first call writes it instead
// of peeking: RawConn.Read has reset the readiness already, so the next
// request, which the client sends only after this response, wakes the
// wait. Then the state goes back, and the connection is idle.
func (cc *Conn) readable(fd uintptr) bool {
	if cc.waited {
		return true
	}
	cc.waited = true
	if cc.pending != nil {
		if !cc.flushPending() {
			cc.pendingFailed = true
			return true
		}
		cc.releaseState()
		cc.idleSince.Store(cc.waitStart)
		return false
	}
	return peekFD(fd)
}

// flushPending writes what writeLast left, if anything; false: the write
// failed and the connection is over.
func (cc *Conn) flushPending() bool {
	b := cc.pending
	if b == nil {
		return true
	}
	cc.pending = nil
	cc.sentBytes -= int64(len(b)) // counted by writeLast; write counts it again
	op := cc.rawOp
	err := cc.write(b)
	// The idle wait's RawConn.Read calls rawStep again when it wakes: it
	// must find its own step there, not the write's.
	cc.rawOp = op
	return err == nil
}

// DeadlineSlackFor is how far a deadline for timeout d may be earlier
// than now+d before it is moved: deadlineSlack, or d/8 for a short d. So
// a timeout fires at most that much early (a 10s header_timeout between
// 9s and 10s after its start, a 200ms one between 175 and 200ms), and a
// deadline left in the past by an earlier exchange is always moved (it
// is more than d/8 behind).
func DeadlineSlackFor(d time.Duration) time.Duration { return min(deadlineSlack, d/8) }

// setReadDeadline makes the read deadline now+d, lazily: it moves only if
// the current one is later than that (too lax) or more than
// DeadlineSlackFor(d) earlier (too soon).
func (cc *Conn) setReadDeadline(d time.Duration) {
	cc.setReadDeadlineFrom(time.Time{}, d)
}

// setReadDeadlineFrom is setReadDeadline with now given (zero: read the
// clock).
func (cc *Conn) setReadDeadlineFrom(now time.Time, d time.Duration) {
	if d <= 0 {
		if !cc.readDeadline.IsZero() {
			cc.readDeadline = time.Time{}
			cc.c.SetReadDeadline(cc.readDeadline)
		}
		return
	}
	if now.IsZero() {
		now = time.Now()
	}
	want := now.Add(d)
	if cc.readDeadline.IsZero() || cc.readDeadline.After(want) || want.Sub(cc.readDeadline) > DeadlineSlackFor(d) {
		cc.readDeadline = want
		cc.readDeadlineMoves++
		cc.c.SetReadDeadline(want)
	}
}

// setWriteDeadline makes the write deadline now+write_timeout, lazily: it
// moves only when it is more than DeadlineSlackFor(write_timeout) earlier
// than that.
func (cc *Conn) setWriteDeadline() {
	d := cc.settings.WriteTimeout
	if d <= 0 {
		return
	}
	want := time.Now().Add(d)
	if cc.writeDeadline.IsZero() || want.Sub(cc.writeDeadline) > DeadlineSlackFor(d) {
		cc.writeDeadline = want
		cc.writeDeadlineMoves++
		cc.c.SetWriteDeadline(want)
	}
}

// read reads more from the client into rbuf[w:]; rbuf must have room.
func (cc *Conn) read() error {
	n, err := cc.c.Read(cc.rbuf[cc.w:])
	if n > 0 {
		cc.w += n
		cc.st.RxBytes.Add(uint64(n))
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// readArmingHeaderTimeout reads more of a request head into rbuf[w:],
// as read does, with the header timeout armed only if the read has to
// wait: a head that is in the socket already, as nearly every one is,
// costs no clock read and no timer. *armed says whether it is armed for
// this head (set when this read arms it). TLS, or no raw socket I/O:
// armed first, then read.
func (cc *Conn) readArmingHeaderTimeout(armed *bool) error {
	if !RawIO || cc.tls != nil {
		cc.setReadDeadline(cc.settings.HeaderTimeout)
		*armed = true
		return cc.read()
	}
	cc.rawOp, cc.rawN, cc.rawErr, cc.headArmed = rawHeadRead, 0, nil, false
	err := cc.raw.Read(cc.rawFn)
	*armed = cc.headArmed
	n := cc.rawN
	if n > 0 {
		cc.w += n
		cc.st.RxBytes.Add(uint64(n))
		return nil
	}
	if err == nil {
		err = cc.rawErr
		if err == nil {
			return io.EOF
		}
		err = &net.OpError{Op: "read", Net: "tcp", Source: cc.tcp.LocalAddr(), Addr: cc.tcp.RemoteAddr(), Err: os.NewSyscallError("read", err)}
	}
	return err
}

// headReadStep is readArmingHeaderTimeout's callback (rawStep): a read,
// or on EAGAIN the header timeout armed and a wait.
func (cc *Conn) headReadStep(fd uintptr) bool {
	n, err := readFD(fd, cc.rbuf[cc.w:])
	if wouldBlock(err) {
		if !cc.headArmed {
			cc.setReadDeadline(cc.settings.HeaderTimeout)
			cc.headArmed = true
		}
		return false
	}
	cc.rawN, cc.rawErr = n, err
	return true
}

// errSpuriousWake: the idle wait woke, and there was nothing to read.
var errSpuriousWake = errors.New("idle wait woke without bytes")

// readAfterWake is a plaintext connection's first read after its idle
// wait woke, into rbuf[w:]: the bytes are there, nearly always, and it
// is the read cc.read would make. When they are not, it does not wait:
// errSpuriousWake, and the connection goes back to its idle wait,
// without a buffer, where the park sweep can ask it to park, instead of
// waiting in a read holding one until its idle timeout. Such a wake
// comes from the runtime's poller reporting an edge from before the
// wait began: bytes that came while the connection was parked, in the
// poller's own epoll, and that it has read since.
func (cc *Conn) readAfterWake() error {
	cc.rawOp, cc.rawN, cc.rawErr = rawWokenRead, 0, nil
	err := cc.raw.Read(cc.rawFn)
	if n := cc.rawN; n > 0 {
		cc.w += n
		cc.st.RxBytes.Add(uint64(n))
		return nil
	}
	if err == nil {
		switch err = cc.rawErr; {
		case err == nil:
			return io.EOF
		case wouldBlock(err):
			return errSpuriousWake
		}
		err = &net.OpError{Op: "read", Net: "tcp", Source: cc.tcp.LocalAddr(), Addr: cc.tcp.RemoteAddr(), Err: os.NewSyscallError("read", err)}
	}
	return err
}

// compact moves the unconsumed bytes to the front of rbuf.
func (cc *Conn) compact() {
	if cc.r > 0 {
		cc.w = copy(cc.rbuf, cc.rbuf[cc.r:cc.w])
		cc.r = 0
	}
}

// write writes b to the client, within the write timeout. A plaintext
// connection arms its write deadline only when a write would block
// (writeStep): a response that the socket's buffer takes at once, as
// nearly all do, costs no clock read and no timer. Once armed, the
// deadline is kept current before each write (setWriteDeadline), as a
// deadline left in the past would fail a write that could go through.
func (cc *Conn) write(b []byte) error {
	if !RawIO || cc.tls != nil || cc.settings.WriteTimeout <= 0 {
		return cc.writeConn(b)
	}
	if !cc.writeDeadline.IsZero() {
		cc.setWriteDeadline()
	}
	cc.rawOp, cc.rawBuf, cc.rawN, cc.rawErr = rawWrite, b, 0, nil
	err := cc.raw.Write(cc.rawFn)
	n := cc.rawN
	cc.rawBuf = nil
	if err == nil && cc.rawErr != nil {
		err = &net.OpError{Op: "write", Net: "tcp", Source: cc.tcp.LocalAddr(), Addr: cc.tcp.RemoteAddr(), Err: os.NewSyscallError("write", cc.rawErr)}
	}
	if n > 0 {
		cc.st.TxBytes.Add(uint64(n))
		cc.sentBytes += int64(n)
	}
	return err
}

// writeStep writes what is left of rawBuf (write's callback, in rawStep).
// When the socket's buffer is full it arms the write deadline, unless one
// is armed: the write must then complete within write_timeout of the
// moment it first had to wait, which is the write's start to within the
// few microseconds of the non-blocking writes before.
func (cc *Conn) writeStep(fd uintptr) bool {
	for cc.rawN < len(cc.rawBuf) {
		n, err := writeFDMore(fd, cc.rawBuf[cc.rawN:], cc.rawMore)
		cc.rawN += n
		switch {
		case err == nil && n > 0:
		case wouldBlock(err):
			if cc.writeDeadline.IsZero() {
				cc.setWriteDeadline()
			}
			return false
		case err == nil:
			cc.rawErr = io.ErrShortWrite
			return true
		default:
			cc.rawErr = err
			return true
		}
	}
	return true
}

// writeConn writes b through cc.c (TLS, or no raw socket I/O), with the
// write deadline armed first.
func (cc *Conn) writeConn(b []byte) error {
	cc.setWriteDeadline()
	n, err := cc.c.Write(b)
	if n > 0 {
		cc.st.TxBytes.Add(uint64(n))
		cc.sentBytes += int64(n)
	}
	return err
}

// writev writes several buffers in one syscall where it can.
func (cc *Conn) writev(bufs *net.Buffers) error {
	cc.setWriteDeadline()
	n, err := bufs.WriteTo(cc.c)
	if n > 0 {
		cc.st.TxBytes.Add(uint64(n))
		cc.sentBytes += n
	}
	return err
}

// readHead reads until cc.ex.req holds a whole request head at rbuf[r:].
// A malformed or oversized head is answered (400, 414, 431, 505) and the
// connection ends: false. woke: the idle wait has just seen bytes come.
func (cc *Conn) readHead(woke bool) bool {
	req := &cc.ex.req
	first := true
	// Parse reads the head from its start each time: it runs again only
	// when the bytes read since hold a line end or cross a limit, so that
	// a client sending a byte at a time costs linear work, not quadratic.
	parse := cc.r < cc.w
	for {
		err := http1.ErrIncomplete
		if parse {
			err = req.Parse(cc.rbuf[cc.r:cc.w], cc.settings.Limits)
		}
		if err == nil {
			cc.fillAfterHead()
			return true
		}
		if perr, ok := err.(*http1.Error); ok {
			if cc.servedAsHTTP2() {
				return false // an HTTP/2 connection preface: served as HTTP/2 (h2.go)
			}
			cc.st.RqTotal.Inc()
			cc.refuse(perr.Status, perr.Reason)
			return false
		}
		// Incomplete: make room and read more, within the header timeout
		// from the first byte of this head. After the idle wait woke, the
		// first read finds bytes there and keeps the idle wait's deadline
		// (until a byte is in, the request has not begun): a keep-alive
		// request then moves no deadline, where arming the header
		// timeout and then the idle one again cost two timer resets.
		// The header timeout is armed only when a read has to wait
		// (readArmingHeaderTimeout): first stays true until it is.
		armNow := first && (cc.r < cc.w || !woke)
		if cc.w == len(cc.rbuf) {
			if cc.r == 0 && !cc.growForHead() {
				// Parse reports 431 before this can happen; a limit
				// larger than the biggest buffer ends here.
				cc.refuse(431, "request head too large")
				return false
			}
			cc.compact()
		}
		before := cc.w
		switch {
		case armNow:
			var armed bool
			err = cc.readArmingHeaderTimeout(&armed)
			first = !armed
		case first && cc.r == cc.w && RawIO && cc.tls == nil:
			err = cc.readAfterWake()
			if err == errSpuriousWake {
				cc.spuriousWake = true
				cc.spuriousWakes++
				return false
			}
		default:
			err = cc.read()
		}
		if err != nil {
			if cc.r < cc.w && isTimeout(err) {
				cc.st.RqTotal.Inc()
				cc.refuse(408, "request head not received in time")
			}
			return false
		}
		parse = bytes.IndexByte(cc.rbuf[before:cc.w], '\n') >= 0 ||
			crosses(before-cc.r, cc.w-cc.r, cc.maxRequestLine()+2) ||
			crosses(before-cc.r, cc.w-cc.r, cc.maxHeadBytes())
	}
}

// fillAfterHead: a head that came with the start of a Content-Length
// body and filled the small buffer most likely has the rest of what the
// client sent right behind it, in the socket: one more read, into the
// large buffer, so that head and body still go to the upstream in one
// write (as they did when every request started with the large buffer).
// Only when more of the body is due, so the read does not wait for bytes
// that will not come; an error shows itself to the body pump's read.
// The head's spans stay valid: growRead keeps rbuf[r:] at the same
// offsets from r.
func (cc *Conn) fillAfterHead() {
	req := &cc.ex.req
	if req.Framing != http1.FramingLength || cc.w < len(cc.rbuf) || len(cc.rbuf) >= IOBufSize {
		return
	}
	if buffered := int64(cc.w - cc.r - req.HeadLen); buffered <= 0 || buffered >= req.ContentLength {
		return
	}
	cc.growRead(IOBufSize)
	cc.setReadDeadline(cc.settings.IdleTimeout)
	cc.read()
}

// crosses reports whether a count that went from a to b reached limit.
func crosses(a, b, limit int) bool { return a < limit && b >= limit }

func (cc *Conn) maxRequestLine() int {
	if n := cc.settings.Limits.MaxRequestLine; n > 0 {
		return n
	}
	return http1.DefaultMaxRequestLine
}

func (cc *Conn) maxHeadBytes() int {
	if n := cc.settings.Limits.MaxHeadBytes; n > 0 {
		return n
	}
	return http1.DefaultMaxHeadBytes
}

// growForHead swaps a full rbuf for a larger one: the small buffer for
// the large pooled one, and that for one big enough for the largest
// allowed head (the rare head larger than IOBufSize pays for its own
// buffer; it is not pooled). readHead parses again after it.
func (cc *Conn) growForHead() bool {
	limit := cc.maxHeadBytes()
	switch {
	case len(cc.rbuf) >= limit+1:
		return false
	case len(cc.rbuf) < IOBufSize:
		cc.growRead(IOBufSize)
	default:
		cc.growRead(limit + 1)
	}
	return true
}

// ListenerSettings are the settings of the connection's listener, not
// shrunk (the overload manager's close_idle compares with their idle
// timeout).
func (cc *Conn) ListenerSettings() *Settings { return cc.l.Settings }
