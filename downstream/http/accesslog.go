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
	cc.status, cc.upAddr, cc.retries = 0, "", 0
}

// finishRecord completes the record and hands it to every log of the
// listener; a full queue drops it, counted, without waiting.
func (cc *Conn) finishRecord(rt *route.Route, start time.Time) {
	r := cc.rec
	r.Duration = time.Since(start)
	r.Status = uint16(cc.status)
	r.BytesSent = cc.sentBytes - r.BytesSent
	r.Retries = uint8(min(cc.retries, 255))
	r.Upstream = cc.upAddr
	if rt != nil {
		r.Cluster = rt.Cluster
	}
	EnqueueRecord(cc.logs, r, cc.st)
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
