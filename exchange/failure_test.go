package exchange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

func TestFailureStatus(t *testing.T) {
	connect := func(err error) error {
		return fmt.Errorf("try 1: %w", &upstream.ConnectError{Cluster: "c", Tried: []string{"10.0.0.1:80"}, Err: err})
	}
	for _, tc := range []struct {
		name   string
		err    error
		status int
		body   string
	}{
		{"circuit breaker", fmt.Errorf("acquire: %w", upstream.ErrOverflow), 503, "upstream overflow"},
		{"refused", connect(&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), 503, "upstream connect error: connection refused"},
		{"dial timeout", connect(context.DeadlineExceeded), 503, "upstream connect error: connect timeout"},
		{"TLS", connect(fmt.Errorf("%w: bad certificate", upstream.ErrTLSHandshake)), 503, "upstream connect error: TLS handshake failed"},
		{"no endpoint", upstream.ErrNoEndpoint, 503, "upstream connect error: no healthy upstream endpoint"},
		{"read timeout", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, 504, "upstream timeout"},
		{"malformed", &http1.Error{Status: 400, Reason: "bad head"}, 502, "upstream sent a malformed response"},
		{"reset", errors.New("connection reset by peer"), 502, "upstream error"},
	} {
		status, body := FailureStatus(tc.err)
		if status != tc.status || body != tc.body {
			t.Errorf("%s: %d %q, want %d %q", tc.name, status, body, tc.status, tc.body)
		}
	}
}
