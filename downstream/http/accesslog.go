package httpfront

import (
	"time"

	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/route"
)

// Access logging on the request path: a connection of a listener with
// access logs has one record of its own (allocated with the connection,
// never per request), filled while the request is handled and copied into
// each log's queue when it is done. Formatting and writing happen on the
// log's writer goroutine (internal/accesslog).

// outcome is what a request's handling leaves for its stats and its
// access-log line, whichever the client protocol: the HTTP/1.1
// connection's (Conn.outcome), an HTTP/2 stream's (ServeH2's).
type outcome struct {
	status  int    // the final status sent; 0: none (an HTTP/2 stream reset)
	upAddr  string // the endpoint of the request's last try
	retries int
	sent    int64 // bytes sent to the client for the request
}

// finishRecord completes r, whose request part its front end filled,
// with the request's outcome, and hands it to the listener's logs.
func finishRecord(r *accesslog.Record, o *outcome, rt *route.Route, start time.Time, logs []*accesslog.Logger, st *Stats) {
	r.Duration = time.Since(start)
	r.Status = uint16(o.status)
	r.Retries = uint8(min(o.retries, 255))
	r.Upstream = o.upAddr
	if rt != nil {
		r.Cluster = rt.Cluster
	}
	r.BytesSent = o.sent
	EnqueueRecord(logs, r, st)
}

// sent counts a response status and keeps it for the access log.
func (cc *Conn) sent(status int) {
	cc.st.Status(status)
	cc.status = status
}

// beginRecord copies what the request's head says into the record, while
// the head is still in rbuf.
func (cc *Conn) beginRecord(head []byte, start time.Time) {
	req := &cc.ex.req
	r := cc.rec
	*r = accesslog.Record{Start: start, Minor: req.Minor}
	r.SetMethod(req.Method.Bytes(head))
	r.SetPath(req.Target.Bytes(head))
	r.SetClientIP(cc.clientIP)
	switch req.Framing {
	case http1.FramingLength:
		r.BytesReceived = req.ContentLength
	case http1.FramingChunked:
		r.BytesReceived = -1
	}
	r.BytesSent = cc.sentBytes // subtracted at the end
	cc.outcome = outcome{}
}

// logRequest completes the record and hands it to every log of the
// listener; a full queue drops it, counted, without waiting.
func (cc *Conn) logRequest(rt *route.Route, start time.Time) {
	cc.outcome.sent = cc.sentBytes - cc.rec.BytesSent
	finishRecord(cc.rec, &cc.outcome, rt, start, cc.logs, cc.st)
}

// EnqueueRecord hands a finished record to every log of the listener,
// whichever front end filled it; a full queue drops it, counted in the
// listener's access_log.dropped (st.LogDropped), without waiting. The
// logs copy r: the caller reuses it.
func EnqueueRecord(logs []*accesslog.Logger, r *accesslog.Record, st *Stats) {
	for _, l := range logs {
		if !l.Enqueue(r) {
			st.LogDropped.Inc()
		}
	}
}
