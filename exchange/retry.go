package exchange

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

// ErrClientBody marks an exchange cut because the client's request body
// was malformed, cut short or too slow: the client is answered 400 (if
// nothing was sent yet); never a 5xx that blames the upstream, never a
// retry.
var ErrClientBody = errors.New("malformed or incomplete request body")

// RetryOn is the set of a route's retry_on conditions.
type RetryOn uint8

const (
	// RetryConnectFailure: the connect failed (nothing was sent).
	RetryConnectFailure RetryOn = 1 << iota
	// RetryReset: the upstream closed or reset before a response head.
	RetryReset
	// Retry5xx: any 5xx, a reset, a timeout or a malformed response.
	Retry5xx
	// RetryGatewayError: 502, 503, 504, and a per-try timeout.
	RetryGatewayError
)

// RetryPolicy is a route's retry keys, compiled when the snapshot is
// built. Its zero value never retries.
type RetryPolicy struct {
	On            RetryOn
	Num           int           // num_retries: retries of one request at most
	PerTry        time.Duration // per_try_timeout; 0: no bound per try
	NonIdempotent bool          // retry_non_idempotent
}

// Accounting is where a run of tries reports what it decided: the
// upstream.WorkerCluster of the request's cluster.
type Accounting interface {
	// ReportStatus feeds outlier detection: status 0 is a failure after
	// the connect.
	ReportStatus(endpoint, status int)
	CountRetry()        // upstream_rq_retry
	CountRetrySuccess() // upstream_rq_retry_success
}

var _ Accounting = (*upstream.WorkerCluster)(nil)

// Try is what a transport tells of one try besides its error and status.
type Try struct {
	// Endpoint is the index of the endpoint the try went to; -1: no
	// connection was had (a breaker, an acquire that failed).
	Endpoint int
	// Stale: the try ran on a reused pooled connection and nothing of a
	// response came back on it, so the upstream may have closed it while
	// idle (a transport that retries stale connections itself leaves it
	// false).
	Stale bool
	// BodyUnsent: the request's body streams from the client and none
	// of it had been taken from the client when the try failed (an
	// Expect: 100-continue client waits for the 100): only the head
	// went upstream, so the request may go again, whatever its method,
	// as long as nothing of a response came (Stale).
	BodyUnsent bool
	// Interim: a 1xx response reached the client; the request is not
	// sent again.
	Interim bool
}

// Verdict is what Next decided.
type Verdict uint8

const (
	// Accept: the try's response (or, for a request whose body
	// streams, the try itself) is the request's: forward it.
	Accept Verdict = iota
	// Fail: the try's error is the request's.
	Fail
	// Retry: try again, on another endpoint where there is one; the
	// failed try's connection or stream is given up, its response never
	// reaches the client.
	Retry
	// RetryFresh: try once more on a fresh connection to the same
	// endpoint: a stale pooled connection was met.
	RetryFresh
)

// Tries is one request's run of tries under its route's RetryPolicy: the
// one place that decides whether a try is repeated, for every pair of
// client and upstream protocol. The zero value is not ready: call Start.
// It allocates nothing, so that it can live in pooled per-request state.
type Tries struct {
	policy   *RetryPolicy
	acct     Accounting
	deadline time.Time
	timeout  time.Duration
	// left is how many retries the policy still allows: none for a
	// request that cannot be sent again.
	left int
	// resend: the request may be sent again after its bytes reached an
	// upstream (idempotent, or retry_non_idempotent).
	resend     bool
	replayable bool
	idempotent bool
	tries      int
	staleUsed  bool
	refused    bool // a refused HTTP/2 stream was sent again for free
	counted    bool // a retry was counted in upstream_rq_retry

	// Retries is how many times the request was sent again, for the
	// access log: retry_on's retries and a stale connection's.
	Retries int
}

// Start begins the run of a request that arrived at start. timeout is
// the route's (its own, or the listener's request_timeout: resolved when
// the snapshot was built) and bounds every try. replayable: the whole
// request can be sent again (no body, or one buffered whole); idempotent:
// its method may be sent twice (RFC 9110 §9.2.2).
func (t *Tries) Start(p *RetryPolicy, acct Accounting, start time.Time, timeout time.Duration, replayable, idempotent bool) {
	*t = Tries{policy: p, acct: acct, deadline: start.Add(timeout), timeout: timeout, replayable: replayable, idempotent: idempotent}
	if replayable {
		t.left = p.Num
	}
	t.resend = idempotent || p.NonIdempotent
}

// Deadline is the request's: no try starts after it, and the response
// head must arrive before it.
func (t *Tries) Deadline() time.Time { return t.deadline }

// TryDeadline is the deadline of a try that starts now: the request's,
// or per_try_timeout from now when that is sooner.
func (t *Tries) TryDeadline() time.Time {
	if p := t.policy.PerTry; p > 0 {
		if d := time.Now().Add(p); d.Before(t.deadline) {
			return d
		}
	}
	return t.deadline
}

// DeadlineSlack is how late a try's deadline may fire
// (upstream.Conn.SetTryDeadline): a sixteenth of the shorter of the
// route's timeout and per_try_timeout, at most tryDeadlineSlackMax.
func (t *Tries) DeadlineSlack() time.Duration {
	d := t.timeout
	if p := t.policy.PerTry; p > 0 && p < d {
		d = p
	}
	return min(tryDeadlineSlackMax, d/16)
}

// tryDeadlineSlackMax bounds DeadlineSlack: a timeout fires at most this
// late, and the deadlines of a pooled connection that carries a request
// every millisecond or two are moved once for several requests.
const tryDeadlineSlackMax = 10 * time.Millisecond

// PerTry reports whether tries have a bound of their own: then an
// accepted try's connection gets the request's deadline back for the
// body.
func (t *Tries) PerTry() bool { return t.policy.PerTry > 0 }

// Next decides what follows a try that ended with err or, when err is
// nil, with a response head of status (0: the head is not read yet, as
// for a request whose body still streams). It counts the retries it
// decides and reports their failed tries to outlier detection; the
// caller reports the accepted response, and a failure, to outlier
// detection itself (Blames says whether).
func (t *Tries) Next(err error, status int, try Try) Verdict {
	first := t.tries == 0
	t.tries++
	if err != nil {
		var ce *upstream.ConnectError
		switch {
		case errors.As(err, &ce):
			// Nothing was sent: safe whatever the method.
			if t.left > 0 && t.policy.On&RetryConnectFailure != 0 && t.inTime() {
				t.retry()
				return Retry
			}
			return Fail
		case try.Endpoint < 0 || !Blames(err):
			// No endpoint to blame: a breaker, the client gone or
			// its body malformed.
			return Fail
		case h2.IsRetrySafe(err):
			// The upstream never processed it (REFUSED_STREAM, a
			// stream above a GOAWAY's last-stream-id: RFC 9113 §8.7):
			// safe whatever the method, once for free (as x/net's
			// transport did), then as retry_on says; not the
			// endpoint's failure.
			switch {
			case !t.replayable || !t.inTime():
				return Fail
			case !t.refused:
				t.refused = true
				t.Retries++
				return Retry
			case t.left > 0 && t.policy.On&(RetryConnectFailure|RetryReset|Retry5xx) != 0:
				t.retry()
				return Retry
			}
			return Fail
		case first && !t.staleUsed && try.Stale && t.staleRetryable(err, try.BodyUnsent):
			t.staleUsed = true
			t.Retries++
			return RetryFresh
		}
		if t.left == 0 || try.Interim || !t.resend || !retryOnError(t.policy.On, err) || !t.inTime() {
			return Fail
		}
		t.acct.ReportStatus(try.Endpoint, 0)
		t.retry()
		return Retry
	}
	if status > 0 && t.retryOnStatus(status) {
		if t.left > 0 && !try.Interim && t.resend && t.inTime() {
			// A response to repeat: never sent to the client.
			t.acct.ReportStatus(try.Endpoint, status)
			t.retry()
			return Retry
		}
	} else if status > 0 && t.counted {
		t.acct.CountRetrySuccess()
	}
	return Accept
}

func (t *Tries) retry() {
	t.left--
	t.Retries++
	t.counted = true
	t.acct.CountRetry()
}

func (t *Tries) inTime() bool { return time.Now().Before(t.deadline) }

// staleRetryable: a request that met a stale pooled connection (closed
// by the upstream while idle) is sent once more on a fresh one when the
// whole request went in the try and repeating it is safe, or when only
// its head went (bodyUnsent): an upstream that never got the body did
// not act on the request.
func (t *Tries) staleRetryable(err error, bodyUnsent bool) bool {
	if !(t.replayable && t.idempotent) && !bodyUnsent || IsTimeout(err) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Blames reports whether a try that failed with err after a connection
// was had counts against its endpoint: not when the client's body was
// at fault, the client went away, or a circuit breaker refused it.
func Blames(err error) bool {
	return !errors.Is(err, ErrClientBody) && !errors.Is(err, context.Canceled) && !errors.Is(err, upstream.ErrOverflow)
}

// retryOnError reports whether a try that failed after its request was
// sent (no response head, a timeout, a malformed response) is retried.
func retryOnError(on RetryOn, err error) bool {
	var pe *http1.Error
	switch {
	case IsTimeout(err):
		// per_try_timeout (the request's own deadline is checked
		// apart).
		return on&(RetryReset|Retry5xx|RetryGatewayError) != 0
	case errors.As(err, &pe):
		return on&Retry5xx != 0
	}
	return on&(RetryReset|Retry5xx) != 0
}

// retryOnStatus reports whether the policy retries a response of status.
func (t *Tries) retryOnStatus(status int) bool {
	on := t.policy.On
	switch {
	case status < 500:
		return false
	case on&Retry5xx != 0:
		return true
	}
	return on&RetryGatewayError != 0 && (status == 502 || status == 503 || status == 504)
}

// IsTimeout reports whether err is a deadline's: a connection's
// (os.ErrDeadlineExceeded), a context's, or any net.Error that says so.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// Idempotent reports whether a request of method may be sent twice (RFC
// 9110 §9.2.2: the safe methods, PUT and DELETE), whatever the protocols:
// Tries.Start asks it of every request, and a retry of a try the upstream
// may have seen needs it (or retry_non_idempotent).
func Idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}
