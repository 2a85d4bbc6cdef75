package httpfront

import (
	"net/http"
	"strconv"
	"time"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
)

// Overload on the request path: the overload manager's published state
// (Overload, built by the worker's SetOverload with NewOverloadRefusal
// and ShrunkSettings) is loaded once per request start; nil, the common
// case, costs that load and nothing else.

// OverloadRefusalBody is the body of a request refused for overload.
const OverloadRefusalBody = "overloaded: try again later"

// NewOverloadRefusal builds the answer to a request refused for
// overload, with Retry-After of retryAfter (rounded up to whole seconds,
// at least 1): the whole HTTP/1.1 response, and the header's value for
// HTTP/2.
func NewOverloadRefusal(retryAfter time.Duration) (http1Response []byte, h2RetryAfter []string) {
	secs := max(int64((retryAfter+time.Second-1)/time.Second), 1)
	b := appendStatusLine(nil, http.StatusServiceUnavailable, "")
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nRetry-After: "...)
	b = strconv.AppendInt(b, secs, 10)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(OverloadRefusalBody)+1), 10)
	b = append(b, "\r\nConnection: close\r\n\r\n"+OverloadRefusalBody+"\n"...)
	return b, []string{strconv.FormatInt(secs, 10)}
}

// ShrunkSettings is s with its header and idle timeouts scaled to
// percent (at least 1ms), remembering s (ShrunkFrom).
func ShrunkSettings(s *Settings, percent int) *Settings {
	c := *s
	c.HeaderTimeout = max(c.HeaderTimeout*time.Duration(percent)/100, time.Millisecond)
	c.IdleTimeout = max(c.IdleTimeout*time.Duration(percent)/100, time.Millisecond)
	c.ShrunkFrom = s
	return &c
}

// overloadSettings is the settings a new HTTP connection starts with:
// the listener's own, or their shrunk copy while shrink_timeouts acts.
func (w *Worker) overloadSettings(s *Settings, li int) *Settings {
	if v := w.Overload.Load(); v != nil && li < len(v.Settings) && v.Settings[li] != nil {
		return v.Settings[li]
	}
	return s
}

// overloaded is the HTTP/1.1 request-start check. Under no overload it
// only puts back the listener's own settings if shrunk ones were in use.
// Otherwise it applies the published state: shrunk timeouts for this
// connection, keep-alive off, or (true) the request answered 503 with
// Retry-After and the connection to close.
func (cc *Conn) overloaded(keep *bool) bool {
	v := cc.l.Worker.Overload.Load()
	if v == nil {
		if s := cc.settings.ShrunkFrom; s != nil {
			cc.settings = s
		}
		return false
	}
	return cc.overloadedSlow(v, keep)
}

func (cc *Conn) overloadedSlow(v *Overload, keep *bool) bool {
	switch {
	case cc.l.Index < len(v.Settings) && v.Settings[cc.l.Index] != nil:
		cc.settings = v.Settings[cc.l.Index]
	case cc.settings.ShrunkFrom != nil:
		cc.settings = cc.settings.ShrunkFrom
	}
	if v.DisableKeepAlive {
		*keep = false
	}
	if !v.RefuseRequests {
		return false
	}
	req := &cc.ex.req
	cc.r += req.HeadLen
	cc.sent(http.StatusServiceUnavailable)
	cc.l.Host.RequestRefused()
	*keep = false
	if cc.write(v.Refusal) == nil && req.Framing != http1.FramingNone {
		cc.lingerClose() // the body is unread: let the client read the answer
	}
	return true
}

// overloaded is the HTTP/2 request-start check: keep-alive off sends the
// connection the graceful GOAWAY (HTTP/2's "Connection: close"); refused,
// the stream is answered 503 with Retry-After (true).
func (f *h2Front) overloaded(st *h2.Stream, s *h2StreamState, out *outcome) bool {
	cc := f.cc
	v := cc.l.Worker.Overload.Load()
	if v == nil {
		return false
	}
	if v.DisableKeepAlive || v.RefuseRequests {
		f.sc.Shutdown()
	}
	if !v.RefuseRequests {
		return false
	}
	cc.l.Host.RequestRefused()
	out.status = h2RefusalReply(st, s, cc.st, v.RetryAfter[0])
	out.sent = int64(len(OverloadRefusalBody) + 1)
	return true
}

// Buffer holding, for reset_connections. A connection marks when it took
// its buffers (takeState) in overload passes, a count the manager
// advances once per interval (so the request path stores a number it
// loads from the Manager, not a clock), and what it holds.

// holdBuffers marks cc as holding buffers since the current pass, with
// bytes of them, for the request it starts (takeState). A few atomic
// operations: the reset pass reads them from another goroutine.
func (cc *Conn) holdBuffers(bytes int) {
	if cc.heldSince.Load() == 0 {
		cc.heldSince.Store(cc.l.Env.OverloadPass.Load() + 1)
	}
	cc.heldBytes.Store(int64(bytes))
	cc.requestsStarted.Add(1)
}

// releaseBuffers marks cc as holding no buffers (releaseState).
func (cc *Conn) releaseBuffers() {
	if cc.heldSince.Load() != 0 {
		cc.heldSince.Store(0)
	}
}

// HeldBuffers says since which overload pass (plus one; 0: none) the
// connection holds buffers, how many bytes of them, how many requests it
// has begun, and whether it is idle between requests: what the worker's
// ResetBiggest ranks connections by. Atomics only.
func (cc *Conn) HeldBuffers() (since, bytes, requests int64, idle bool) {
	return cc.heldSince.Load(), cc.heldBytes.Load(), cc.requestsStarted.Load(), cc.idleSince.Load() != 0
}

// Reset closes the connection with a TCP reset (SO_LINGER 0): the
// overload manager's reset_connections.
func (cc *Conn) Reset() {
	cc.tcp.SetLinger(0)
	cc.Close()
}
