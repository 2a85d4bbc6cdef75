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
	tw := &h2TimedWriter{w: w, timeout: h.writeTimeout}
	defer tw.stop()
	h.next.ServeHTTP(tw, r)
	tw.finish()
}

// h2WriteDeadliner is x/net's ResponseWriter's per-stream write deadline.
type h2WriteDeadliner interface {
	SetWriteDeadline(time.Time) error
}

// h2TimedWriter is a stream's ResponseWriter with each Write and Flush
// bounded by timeout. Used by the handler's goroutine, but for expire.
type h2TimedWriter struct {
	w       http.ResponseWriter
	timeout time.Duration
	timer   *time.Timer // made at the first write
	dirty   bool        // written since the last Flush

	mu   sync.Mutex // guards done: the reset must not outlive the handler
	done bool       // the handler has returned: w is no longer its to use
}

var _ http.Flusher = (*h2TimedWriter)(nil)

func (t *h2TimedWriter) Header() http.Header { return t.w.Header() }

func (t *h2TimedWriter) WriteHeader(status int) { t.w.WriteHeader(status) }

func (t *h2TimedWriter) Write(p []byte) (int, error) {
	t.arm()
	n, err := t.w.Write(p)
	t.timer.Stop()
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
	t.timer.Stop()
	t.dirty = false
}

func (t *h2TimedWriter) arm() {
	if t.timer == nil {
		t.timer = time.AfterFunc(t.timeout, t.expire)
		return
	}
	t.timer.Reset(t.timeout)
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

// stop ends the timing: after it, expire leaves w alone.
func (t *h2TimedWriter) stop() {
	t.mu.Lock()
	t.done = true
	t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
	}
}

// finish hands the bytes x/net still buffers to its own write deadline:
// they go out after the handler returns.
func (t *h2TimedWriter) finish() {
	t.stop()
	if d, ok := t.w.(h2WriteDeadliner); ok && t.dirty {
		d.SetWriteDeadline(time.Now().Add(t.timeout))
	}
}
