package exchange

import "time"

// UpstreamTransport is the seam below the core: one try of one request on
// an upstream, whatever protocol the upstream speaks: an HTTP/1.1
// client's exchange over the HTTP/1.1 pool and an HTTP/2 client's over
// the same pool (in workers, over their front ends' buffers), and any
// client's over the HTTP/2 multiplexed pool (H2Transport, here).
type UpstreamTransport interface {
	// Try sends the request once: the n-th try (0: the first), to an
	// endpoint the cluster's balancer picks, avoiding endpoint avoid
	// (-1: none), or on a fresh connection to endpoint avoid when
	// fresh (a stale pooled connection was met). tryDeadline bounds the
	// try. status is the response head's (0: not read yet, for a
	// request whose body still streams from the client); try says
	// what the transport knows of it for the policy.
	Try(n, avoid int, fresh bool, tryDeadline time.Time) (status int, try Try, err error)
	// Abandon gives up the try just made, for a retry: its connection
	// or stream is closed, its response never read further nor sent to
	// the client.
	Abandon()
}

// RoundTrip runs the request's tries through tr until t's policy accepts
// one (nil: the last try's response is the request's, still to be read
// from tr) or fails the request (the last try's error, its connection or
// stream left for the caller to settle).
func RoundTrip(t *Tries, tr UpstreamTransport) error {
	avoid, fresh := -1, false
	for n := 0; ; n++ {
		status, try, err := tr.Try(n, avoid, fresh, t.TryDeadline())
		switch v := t.Next(err, status, try); v {
		case Accept:
			return nil
		case Fail:
			return err
		default:
			tr.Abandon()
			avoid, fresh = try.Endpoint, v == RetryFresh
		}
	}
}
