package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// newTransport builds one worker's pool for one cluster. Requests reach it
// with URL.Host set to an endpoint's "ip:port", so the transport's
// per-host pools are per-endpoint pools.
func newTransport(wc *WorkerCluster, idle time.Duration, maxIdle int) *http.Transport {
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	return &http.Transport{
		// Never from the environment: a proxy that obeys HTTP_PROXY sends
		// its upstream traffic somewhere the config does not say.
		Proxy:       nil,
		DialContext: wc.dialMarked,
		// The client's Accept-Encoding and the upstream's Content-Encoding
		// pass through untouched.
		DisableCompression:  true,
		Protocols:           protos,
		MaxIdleConnsPerHost: maxIdle,
		IdleConnTimeout:     idle,
		// Left 0: the caller bounds each request with its context.
		ResponseHeaderTimeout: 0,
	}
}

// dialError marks an error from the transport's dial: nothing of the
// request was written, so it may go to another endpoint.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (wc *WorkerCluster) dialMarked(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := wc.dialer.DialContext(ctx, network, addr)
	if err != nil {
		if ctx.Err() == nil {
			// A connect abandoned by the caller (or by the
			// transport, which dials ahead) is not a failure.
			wc.dialed(nil, err)
		}
		return nil, &dialError{err}
	}
	return wc.dialed(c, nil), nil
}

// roundTripper is a WorkerCluster's http.RoundTripper.
type roundTripper struct{ wc *WorkerCluster }

var _ http.RoundTripper = (*roundTripper)(nil)

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	wc := rt.wc
	n := len(wc.addrs)
	if n == 0 || req.URL == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		if req.URL == nil {
			return nil, errors.New("upstream: nil Request.URL")
		}
		return nil, fmt.Errorf("cluster %q: %w", wc.name, ErrNoEndpoint)
	}

	st := wc.stats.Load()
	var start time.Time
	if st != nil {
		st.RqTotal.Inc()
		start = time.Now()
	}
	var body *replayBody
	if req.Body != nil && req.Body != http.NoBody {
		body = &replayBody{rc: req.Body}
	}
	ctx := req.Context()
	first := wc.bal.pick()
	var tried []string
	var last error
	for k := range n {
		i := (first + k) % n
		addr := wc.addrs[i]

		// A shallow copy per attempt: the caller's request is never
		// modified, and each attempt has its own URL and body handle.
		out := new(http.Request)
		*out = *req
		u := *req.URL
		u.Scheme = "http"
		u.Host = addr
		out.URL = &u
		var ab *attemptBody
		if body != nil {
			ab = &attemptBody{b: body}
			out.Body = ab
		}

		wc.bal.start(i)
		resp, err := wc.transport.RoundTrip(out)
		if err == nil {
			ab.commit()
			if st != nil {
				st.RqTime.Record(msSince(start))
			}
			if wc.bal.counts() {
				resp.Body = countBody(resp.Body, wc.bal, i)
			}
			return resp, nil
		}
		wc.bal.finish(i)

		var de *dialError
		if !errors.As(err, &de) {
			ab.commit()
			return nil, err
		}
		tried = append(tried, addr)
		last = de.err
		if k == n-1 || ctx.Err() != nil || (body != nil && body.read.Load()) {
			// Out of endpoints, or the caller gave up, or the body is
			// partly consumed and cannot be offered again.
			ab.commit()
			break
		}
		// Abandoned attempt: its Close stays a no-op, the body is kept
		// for the next endpoint.
	}
	return nil, &ConnectError{Cluster: wc.name, Tried: tried, Err: last}
}

// replayBody is a request body that may be offered to several endpoints in
// turn, as long as none of it has been read.
type replayBody struct {
	rc        io.ReadCloser
	read      atomic.Bool // some byte was read: the body cannot be replayed
	closeOnce sync.Once
	closeErr  error
}

func (b *replayBody) close() error {
	b.closeOnce.Do(func() { b.closeErr = b.rc.Close() })
	return b.closeErr
}

// attemptBody is replayBody as one attempt sees it. The transport closes a
// request's body when the attempt fails; that Close must not reach the real
// body unless this attempt's outcome is final. The transport may close
// before or after RoundTrip returns, so whichever of Close and commit comes
// second closes the real body.
type attemptBody struct {
	b      *replayBody
	closed atomic.Bool // the transport closed this attempt's body
	final  atomic.Bool // this attempt's outcome goes back to the caller
}

func (a *attemptBody) Read(p []byte) (int, error) {
	n, err := a.b.rc.Read(p)
	if n > 0 && !a.b.read.Load() {
		a.b.read.Store(true)
	}
	return n, err
}

func (a *attemptBody) Close() error {
	a.closed.Store(true)
	if a.final.Load() {
		return a.b.close()
	}
	return nil
}

// commit marks the attempt final. A nil attemptBody (no request body) is
// fine.
func (a *attemptBody) commit() {
	if a == nil {
		return
	}
	a.final.Store(true)
	if a.closed.Load() {
		a.b.close()
	}
}

// countBody keeps endpoint i counted as busy until the response body is
// closed. An upgraded connection's body (101) is also a Writer, and callers
// rely on that, so it stays one.
func countBody(rc io.ReadCloser, bal balancer, i int) io.ReadCloser {
	if rc == nil || rc == http.NoBody {
		// Nothing left to read: the request is over.
		bal.finish(i)
		return rc
	}
	if rwc, ok := rc.(io.ReadWriteCloser); ok {
		return &countedRWBody{countedBody: countedBody{rc: rc, bal: bal, i: i}, w: rwc}
	}
	return &countedBody{rc: rc, bal: bal, i: i}
}

type countedBody struct {
	rc   io.ReadCloser
	bal  balancer
	i    int
	done atomic.Bool
}

func (b *countedBody) Read(p []byte) (int, error) { return b.rc.Read(p) }

func (b *countedBody) Close() error {
	err := b.rc.Close()
	if b.done.CompareAndSwap(false, true) {
		b.bal.finish(b.i)
	}
	return err
}

type countedRWBody struct {
	countedBody
	w io.Writer
}

func (b *countedRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }
