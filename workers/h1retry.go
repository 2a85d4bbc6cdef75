package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// tryUntilResponse sends the request (head b, then bodyRef) and, when its
// body is complete, reads the response head; it sends it again where the
// route's retry policy says so (or once on a stale pooled connection), to
// another endpoint where there is one. On return, x.up is the connection
// of the last try (nil if none connected) and, on success with
// x.bodyDone, cc.ex.resp its response head. A try is repeated only while
// the whole request is in b and bodyRef (x.bodyDone: nothing streams from
// the client) and nothing of a response reached the client; a response
// it repeats is read no further and its connection closed.
func (x *exchange) tryUntilResponse(lv *listenerView, rt *route, b, bodyRef []byte) error {
	cc := x.cc
	timeout := rt.timeout // the route's, or the listener's: resolved when compiled
	deadline := x.start.Add(timeout)
	pol := &rt.retry
	left := 0
	if x.bodyDone {
		left = pol.num
	}
	key := cc.hashKey(&rt.hashOn, x.head)
	prev, stale := -1, false
	staleRetried := false
	var err error
	for attempt := 0; ; attempt++ {
		switch {
		case attempt == 0:
			// A stale pooled connection is caught by the retry below,
			// for a request that can be sent twice; any other takes a
			// checked one.
			x.up, err = x.wc.AcquireKey(cc.m.ctx, key, !(x.idempotent && x.bodyDone))
		case stale:
			x.up, err = x.wc.AcquireFresh(cc.m.ctx, prev)
		default:
			x.up, err = x.wc.AcquireRetry(cc.m.ctx, key, prev)
		}
		if err != nil {
			x.up = nil
			var ce *upstream.ConnectError
			if left > 0 && pol.on&retryConnectFailure != 0 && errors.As(err, &ce) && time.Now().Before(deadline) {
				// Nothing was sent: safe whatever the method.
				left--
				x.countRetry()
				prev, stale = -1, false
				continue
			}
			return err
		}
		tryDeadline := deadline
		if pol.perTry > 0 {
			tryDeadline = minTime(deadline, time.Now().Add(pol.perTry))
		}
		x.up.SetDeadline(tryDeadline)
		if x.bodyDone {
			// The whole request goes with its head: written from
			// inside the wait for the answer (sendThenReadHead). A
			// stale pooled connection shows itself now, as EOF or a
			// reset.
			err = x.sendThenReadHead(b, bodyRef)
		} else {
			err = x.sendHead(b, bodyRef)
		}
		prev, stale = x.up.EndpointIndex(), false
		switch {
		case err != nil && !staleRetried && attempt == 0 && x.retryable(err):
			staleRetried, stale = true, true
			x.retries++
		case err != nil:
			if left == 0 || x.interim || !x.mayResend(pol) || !retryOnError(pol.on, err) || !time.Now().Before(deadline) {
				return err
			}
			// Hook (upstream resilience): the failed try counts for
			// outlier detection.
			x.wc.ReportStatus(prev, 0)
			left--
			x.countRetry()
		case x.bodyDone && left > 0 && !x.interim && retryOnStatus(pol.on, int(cc.ex.resp.Status)) &&
			x.mayResend(pol) && time.Now().Before(deadline):
			// A response to repeat: never sent to the client, its
			// connection closed rather than its body read.
			x.wc.ReportStatus(prev, int(cc.ex.resp.Status))
			left--
			x.countRetry()
		default:
			if left < pol.num && x.bodyDone && err == nil && !retryOnStatus(pol.on, int(cc.ex.resp.Status)) {
				x.wc.CountRetrySuccess()
			}
			if !x.bodyDone || err != nil || pol.perTry == 0 {
				return err
			}
			// The body is read within the request deadline, no longer
			// the try's.
			x.up.SetDeadline(deadline)
			return nil
		}
		x.up.Discard()
		x.up = nil
		x.ur, x.uw = 0, 0
	}
}

func (x *exchange) countRetry() {
	x.retries++
	x.wc.CountRetry()
}

// mayResend: the request's bytes reached the upstream, which may have
// acted on them; only an idempotent request is sent again, unless the
// route says retry_non_idempotent.
func (x *exchange) mayResend(pol *retryPolicy) bool {
	return x.idempotent || pol.nonIdempotent
}

// retryOnError reports whether a try that failed after its request was
// sent (no response head, a timeout, a malformed response) is retried.
func retryOnError(on retryOn, err error) bool {
	if errors.Is(err, errClientBody) || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *http1.Error
	switch {
	case isTimeout(err):
		// per_try_timeout (the request's own deadline is checked
		// apart).
		return on&(retryReset|retry5xx|retryGatewayError) != 0
	case errors.As(err, &pe):
		return on&retry5xx != 0
	}
	return on&(retryReset|retry5xx) != 0
}

// retryOnStatus reports whether a response with status is retried.
func retryOnStatus(on retryOn, status int) bool {
	switch {
	case status < 500:
		return false
	case on&retry5xx != 0:
		return true
	}
	return on&retryGatewayError != 0 && (status == 502 || status == 503 || status == 504)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// hashKey finds the request's hash_on key (upstream.HashKey; 0: the
// request has none) without allocating.
func (cc *clientConn) hashKey(h *hashSource, head []byte) uint64 {
	req := &cc.ex.req
	switch h.kind {
	case hashSourceIP:
		return upstream.HashKey(cc.clientIP)
	case hashHeader:
		for i := range req.NFields {
			f := &req.Fields[i]
			if http1.EqualFold(f.Name.Bytes(head), h.name) {
				return upstream.HashKey(f.Value.Bytes(head))
			}
		}
	case hashCookie:
		for i := range req.NFields {
			f := &req.Fields[i]
			if !http1.EqualFold(f.Name.Bytes(head), "cookie") {
				continue
			}
			if v, ok := cookieValue(f.Value.Bytes(head), h.name); ok {
				return upstream.HashKey(v)
			}
		}
	}
	return 0
}

// cookieValue returns the value of cookie name in a Cookie header's value
// ("a=1; session=xyz"), without allocating.
func cookieValue(header []byte, name string) ([]byte, bool) {
	for len(header) > 0 {
		pair := header
		if i := bytes.IndexByte(header, ';'); i >= 0 {
			pair, header = header[:i], header[i+1:]
		} else {
			header = nil
		}
		pair = bytes.TrimLeft(pair, " \t")
		if len(pair) > len(name) && pair[len(name)] == '=' && string(pair[:len(name)]) == name {
			return bytes.TrimRight(pair[len(name)+1:], " \t"), true
		}
	}
	return nil, false
}

// retryable: a request that met a stale pooled connection (closed by the
// upstream while idle) is sent once more on a fresh one, when nothing of a
// response came back, the whole body went with the head, and repeating the
// request is safe.
func (x *exchange) retryable(err error) bool {
	if !x.up.Reused() || !x.bodyDone || x.uw > 0 || isTimeout(err) || errors.Is(err, errClientBody) {
		return false
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false
	}
	return x.idempotent
}
