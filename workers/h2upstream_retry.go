package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
)

// h1retry.go's loop for a request to an HTTP/2 upstream: a try that fails
// to connect, is reset before its response head, exceeds per_try_timeout
// or answers a status the route's retry_on names is tried again, on
// another endpoint where there is one, while num_retries and the request
// timeout allow. Only a request whose body can be sent again (none, or
// one buffered whole) is tried more than once. Every response head and
// every failure after the connect is reported to outlier detection.

// h2TryRequest is a request for roundTrip.
type h2TryRequest struct {
	out *http.Request
	// ctx is the client's request's: the tries end with it.
	ctx context.Context
	key uint64 // hash_on key; 0: none
	// replayable: out has no body, or body (buffered whole) is it.
	replayable bool
	body       []byte
	idempotent bool
}

// h2Reply is roundTrip's outcome: the response of the last try, whose
// body the caller reads and then calls done.
type h2Reply struct {
	resp     *http.Response
	endpoint string // the last try's endpoint address; "": none
	retries  int
	done     func()
}

// roundTrip sends req through u, trying again as rt's retry policy says.
// The request timeout (rt's, or the listener's request_timeout) bounds
// the tries and the wait for the response head, per_try_timeout each
// try's wait.
func (u *h2Upstream) roundTrip(lv *listenerView, rt *route, start time.Time, req *h2TryRequest) (h2Reply, error) {
	var reply h2Reply
	timeout := rt.timeout // the route's, or the listener's: resolved when compiled
	deadline := start.Add(timeout)
	pol := &rt.retry
	left := 0
	if req.replayable {
		left = pol.num
	}
	mayResend := req.idempotent || pol.nonIdempotent
	avoid := -1
	for attempt := 0; ; attempt++ {
		try := &h2Try{key: req.key, avoid: avoid, retry: attempt > 0, endpoint: -1}
		resp, cancel, err := u.tryOnce(req, try, deadline, pol.perTry)
		if try.addr != "" {
			reply.endpoint = try.addr
		}
		var ce *upstream.ConnectError
		switch {
		case err != nil && errors.As(err, &ce):
			// Nothing was sent: safe whatever the method.
			try.finish()
			cancel()
			if left == 0 || pol.on&retryConnectFailure == 0 || !time.Now().Before(deadline) {
				return reply, err
			}
		case err != nil:
			try.finish()
			cancel()
			if try.endpoint < 0 || errors.Is(err, context.Canceled) || errors.Is(err, upstream.ErrOverflow) || errors.Is(err, errClientBody) {
				// No endpoint to blame: a breaker, the client gone
				// or its body malformed.
				return reply, err
			}
			timedOut := errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(deadline)
			if !timedOut {
				// Reset, a malformed response, per_try_timeout: the
				// endpoint failed after the connect.
				u.wc.ReportStatus(try.endpoint, 0)
			}
			if timedOut || left == 0 || !mayResend || !retryOnError(pol.on, err) || !time.Now().Before(deadline) {
				return reply, err
			}
		default:
			u.wc.ReportStatus(try.endpoint, resp.StatusCode)
			if left > 0 && retryOnStatus(pol.on, resp.StatusCode) && mayResend && time.Now().Before(deadline) {
				// A response to repeat: never sent to the client,
				// its stream reset rather than its body read.
				cancel()
				resp.Body.Close()
				try.finish()
				break
			}
			if left < pol.num && !retryOnStatus(pol.on, resp.StatusCode) {
				u.wc.CountRetrySuccess()
			}
			reply.resp = resp
			reply.done = func() {
				resp.Body.Close()
				cancel()
				try.finish()
			}
			return reply, nil
		}
		left--
		reply.retries++
		u.wc.CountRetry()
		avoid = try.endpoint
	}
}

// tryOnce sends one try of req and waits for its response head until the
// request's deadline or, sooner, per_try_timeout. cancel ends the try's
// stream: after the response's body, or at once for a try given up. A
// try that ran out of time fails with context.DeadlineExceeded.
func (u *h2Upstream) tryOnce(req *h2TryRequest, try *h2Try, deadline time.Time, perTry time.Duration) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(context.WithValue(req.ctx, h2TryKey{}, try))
	if err := req.ctx.Err(); err != nil {
		return nil, cancel, err // the client reset the stream: send nothing
	}
	wait := time.Until(deadline)
	if perTry > 0 && perTry < wait {
		wait = perTry
	}
	timer := time.AfterFunc(wait, cancel)
	out := req.out.WithContext(ctx)
	if len(req.body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(req.body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(req.body)), nil }
	}
	resp, err := u.t.RoundTrip(out)
	if !timer.Stop() && err != nil && errors.Is(err, context.Canceled) && req.ctx.Err() == nil {
		err = context.DeadlineExceeded // the timer, not the client
	}
	return resp, cancel, err
}
