package workers

import (
	"net/http"
	"sync"
	"time"
)

// h2StreamGuard wraps each HTTP/2 stream's handler with what x/net's
// server leaves to the handler:
//
//   - A stream the client reset before its handler ran is not served: x/net
//     starts handlers on goroutines of their own, and a client that sends
//     HEADERS and RST_STREAM back to back (Rapid Reset) would otherwise
//     have each request reach an upstream before x/net has read the reset.
//     The handler first waits (bounded) until x/net has processed every
//     frame the guard had read from the connection when it started (the
//     guard reads ahead: a reset sent with the request is among them). The exchanges check the request
//     context again before dialing and before sending (h2proxy.go,
//     h2upstream_retry.go), and the connection guard bounds the rate of
//     resets (h2guard.go).
//   - write_timeout bounds each write of a response, as it bounds HTTP/1.1
//     ones. x/net's WriteByteTimeout covers only writes to the socket; a
//     stream whose flow-control window the client keeps closed
//     (SETTINGS_INITIAL_WINDOW_SIZE = 0) blocks its handler, and with it
//     an upstream connection, in a write that never reaches the socket.
//     Each write is timed here; at write_timeout the stream is reset
//     (x/net's ResponseWriter.SetWriteDeadline with a deadline in the
//     past), the write fails, and the exchange closes its upstream
//     connection (a response cut short never goes back to a pool). The
//     bytes x/net still holds when the handler returns are flushed after
//     it, under x/net's own per-stream write deadline, which it stops when
//     the stream ends.
type h2StreamGuard struct {
	next         http.Handler
	guard        *h2Guard
	writeTimeout time.Duration // 0: none
}

var _ http.Handler = (*h2StreamGuard)(nil)

func (h *h2StreamGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The frames that came with the request (a RST_STREAM among them)
	// are processed first.
	h.guard.awaitProcessed(r.Context().Done())
	if r.Context().Err() != nil {
		return // reset before it started: nothing to answer, or to forward
	}
	if h.writeTimeout <= 0 {
		h.next.ServeHTTP(w, r)
		return
	}
	tw := h2TimedWriters.Get().(*h2TimedWriter)
	tw.start(w, h.writeTimeout)
	defer tw.end()
	h.next.ServeHTTP(tw, r)
	tw.finish()
}

// h2WriteDeadliner is x/net's ResponseWriter's per-stream write deadline.
type h2WriteDeadliner interface {
	SetWriteDeadline(time.Time) error
}

// h2TimedWriter is a stream's ResponseWriter with each Write and Flush
// bounded by timeout. Used by the handler's goroutine, but for expire.
// Pooled with its timer (whose function is its expire), and put back only
// if that timer never fired: an expire still on its way must find done.
type h2TimedWriter struct {
	w       http.ResponseWriter
	timeout time.Duration
	timer   *time.Timer // stopped but while a Write or Flush runs
	dirty   bool        // written since the last Flush
	armed   bool        // a Write or Flush runs: the timer is set
	fired   bool        // the timer fired during this stream

	mu   sync.Mutex // guards done: the reset must not outlive the handler
	done bool       // the handler has returned: w is no longer its to use
}

var h2TimedWriters = sync.Pool{New: func() any {
	t := new(h2TimedWriter)
	t.timer = time.AfterFunc(time.Hour, t.expire)
	t.timer.Stop()
	return t
}}

func (t *h2TimedWriter) start(w http.ResponseWriter, timeout time.Duration) {
	t.w, t.timeout, t.dirty, t.fired = w, timeout, false, false
	t.mu.Lock()
	t.done = false
	t.mu.Unlock()
}

var _ http.Flusher = (*h2TimedWriter)(nil)

func (t *h2TimedWriter) Header() http.Header { return t.w.Header() }

func (t *h2TimedWriter) WriteHeader(status int) { t.w.WriteHeader(status) }

func (t *h2TimedWriter) Write(p []byte) (int, error) {
	t.arm()
	n, err := t.w.Write(p)
	t.disarm()
	if n > 0 {
		t.dirty = true
	}
	return n, err
}

func (t *h2TimedWriter) Flush() {
	f, ok := t.w.(http.Flusher)
	if !ok {
		return
	}
	t.arm()
	f.Flush()
	t.disarm()
	t.dirty = false
}

func (t *h2TimedWriter) arm() {
	t.armed = true
	t.timer.Reset(t.timeout)
}

// disarm stops the timer after a write; false from Stop means its
// function has started (the timer was armed): the stream is being reset.
func (t *h2TimedWriter) disarm() {
	t.armed = false
	if !t.timer.Stop() {
		t.fired = true
	}
}

// expire resets the stream of a write blocked for timeout.
func (t *h2TimedWriter) expire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	if d, ok := t.w.(h2WriteDeadliner); ok {
		// In the past: x/net resets the stream at once, and the
		// blocked write returns.
		d.SetWriteDeadline(time.Unix(1, 0))
	}
}

// finish hands the bytes x/net still buffers to its own write deadline:
// they go out after the handler returns. Not after a panic: x/net resets
// the stream then.
func (t *h2TimedWriter) finish() {
	if d, ok := t.w.(h2WriteDeadliner); ok && t.dirty {
		d.SetWriteDeadline(time.Now().Add(t.timeout))
	}
}

// end ends the timing, once the handler has returned: after it, expire
// leaves w alone, and the writer goes back to the pool unless its timer
// fired.
func (t *h2TimedWriter) end() {
	if t.armed {
		t.disarm() // the handler panicked in a write
	}
	t.mu.Lock()
	t.done = true
	t.mu.Unlock()
	t.w = nil
	if !t.fired {
		h2TimedWriters.Put(t)
	}
}
