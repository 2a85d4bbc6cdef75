package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
)

// A request to an HTTP/2 upstream, through exchange.RoundTrip: a try that fails
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

// roundTrip sends req through u, trying again as rt's retry policy
// (exchange.Tries) says. The request timeout (rt's, or the listener's
// request_timeout) bounds the tries and the wait for the response head,
// per_try_timeout each try's wait.
func (u *h2Upstream) roundTrip(lv *listenerView, rt *route.Route, start time.Time, req *h2TryRequest) (h2Reply, error) {
	x := &h2UpstreamExchange{u: u, req: req}
	t := &x.tries
	t.Start(&rt.Retry, u.wc, start, rt.Timeout, req.replayable, req.idempotent)
	err := exchange.RoundTrip(t, x)
	x.reply.retries = t.Retries
	try, resp, cancel := x.try, x.resp, x.cancel
	if err != nil {
		try.Finish()
		cancel()
		// The request's own deadline running out says nothing of the
		// endpoint (per_try_timeout does).
		timedOut := exchange.IsTimeout(err) && !time.Now().Before(t.Deadline())
		if try.Endpoint >= 0 && exchange.Blames(err) && !timedOut && !isConnectError(err) {
			u.wc.ReportStatus(try.Endpoint, 0)
		}
		return x.reply, err
	}
	u.wc.ReportStatus(try.Endpoint, resp.StatusCode)
	x.reply.resp = resp
	x.reply.done = func() {
		resp.Body.Close()
		cancel()
		try.Finish()
	}
	return x.reply, nil
}

// h2UpstreamExchange is one request's tries on an HTTP/2 upstream
// (exchange.UpstreamTransport): the last try, its response and the
// cancel that ends its stream.
type h2UpstreamExchange struct {
	u      *h2Upstream
	req    *h2TryRequest
	tries  exchange.Tries
	reply  h2Reply
	try    *upstream.H2Try
	resp   *http.Response
	cancel context.CancelFunc
}

var _ exchange.UpstreamTransport = (*h2UpstreamExchange)(nil)

// Try sends one try of the request through the transport, whose pool
// picks the endpoint (the transport retries a stale connection itself:
// no Stale).
func (x *h2UpstreamExchange) Try(n, avoid int, _ bool, tryDeadline time.Time) (int, exchange.Try, error) {
	x.try = &upstream.H2Try{Key: x.req.key, Avoid: avoid, Retry: n > 0, Endpoint: -1}
	var err error
	x.resp, x.cancel, err = x.u.tryOnce(x.req, x.try, tryDeadline)
	if x.try.Addr != "" {
		x.reply.endpoint = x.try.Addr
	}
	status := 0
	if err == nil {
		status = x.resp.StatusCode
	}
	return status, exchange.Try{Endpoint: x.try.Endpoint}, err
}

// Abandon resets the try's stream: a response to repeat is never sent
// to the client, nor its body read.
func (x *h2UpstreamExchange) Abandon() {
	if x.resp != nil {
		x.resp.Body.Close()
		x.resp = nil
	}
	x.cancel()
	x.try.Finish()
}

func isConnectError(err error) bool {
	var ce *upstream.ConnectError
	return errors.As(err, &ce)
}

// tryOnce sends one try of req and waits for its response head until the
// request's deadline or, sooner, per_try_timeout. cancel ends the try's
// stream: after the response's body, or at once for a try given up. A
// try that ran out of time fails with context.DeadlineExceeded.
func (u *h2Upstream) tryOnce(req *h2TryRequest, try *upstream.H2Try, tryDeadline time.Time) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(upstream.WithH2Try(req.ctx, try))
	if err := req.ctx.Err(); err != nil {
		return nil, cancel, err // the client reset the stream: send nothing
	}
	timer := time.AfterFunc(time.Until(tryDeadline), cancel)
	out := req.out.WithContext(ctx)
	if len(req.body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(req.body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(req.body)), nil }
	}
	resp, err := u.pool.RoundTrip(out)
	if !timer.Stop() && err != nil && errors.Is(err, context.Canceled) && req.ctx.Err() == nil {
		err = context.DeadlineExceeded // the timer, not the client
	}
	return resp, cancel, err
}
