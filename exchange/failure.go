package exchange

import (
	"context"
	"errors"
	"syscall"

	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

// FailureStatus is what the client is told when the upstream failed its
// request, whichever the protocols: a status and a short body. 503 when
// no upstream took the request (or a circuit breaker refused it), 504 on
// a timeout, 502 otherwise.
func FailureStatus(err error) (status int, body string) {
	var ce *upstream.ConnectError
	var pe *http1.Error
	switch {
	case errors.Is(err, upstream.ErrOverflow):
		// A circuit breaker refused the request: at once, not queued.
		return 503, "upstream overflow"
	case errors.As(err, &ce):
		return 503, "upstream connect error: " + dialReason(ce.Err)
	case errors.Is(err, upstream.ErrNoEndpoint):
		return 503, "upstream connect error: no healthy upstream endpoint"
	case IsTimeout(err):
		return 504, "upstream timeout"
	case errors.As(err, &pe):
		return 502, "upstream sent a malformed response"
	}
	return 502, "upstream error"
}

// dialReason is a connect error in a few words, without addresses.
func dialReason(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "connect failed"
	case IsTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return "connect timeout"
	case errors.Is(err, upstream.ErrTLSHandshake):
		return "TLS handshake failed"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return "connect failed"
}
