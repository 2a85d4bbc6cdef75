package workers

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/workers/h2"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// An HTTP/2 stream proxied to an HTTP/2 cluster, through the cluster's
// multiplexed pool (h2upstream.go, h2upstream_retry.go). The pool is
// still x/net's client (upstream.H2Pool), which takes an http.Request:
// this path allocates one per request until the pool runs on workers/h2's
// ClientConn.

func (f *h2Front) proxyToHTTP2(st *h2.Stream, s *h2StreamState, lv *listenerView, rt *route.Route, u *h2Upstream, start time.Time, out *streamOutcome) {
	cc := f.cc
	ctx, cancel := context.WithCancel(cc.m.ctx)
	defer cancel()
	// The client's reset ends the tries.
	reset, stop := st.Done(), make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-reset:
			cancel()
		case <-stop:
		}
	}()
	host := h2Host(st)
	req := &http.Request{
		Method:     st.Method(),
		URL:        &url.URL{Scheme: u.pool.Scheme(), Host: u.wc.Name(), Opaque: st.Path()},
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Host:       host,
		Header:     make(http.Header, len(st.Fields())+4),
	}
	fwd := &s.fwd
	fwd.Reset(cc.client(), stringBytes(host), true)
	for _, hf := range st.Fields() {
		if hf.Name == "host" {
			continue
		}
		if fwd.Take(stringBytes(hf.Name), stringBytes(hf.Value)) {
			k := http.CanonicalHeaderKey(hf.Name)
			req.Header[k] = append(req.Header[k], hf.Value)
		}
	}
	addOwnFields(req.Header, fwd)
	try := h2TryRequest{
		out:        req,
		ctx:        ctx,
		key:        h2HashKeyOf(&rt.HashOn, st, cc.clientIP),
		replayable: true,
		idempotent: idempotentMethod(req.Method),
	}
	var body *h2StreamBody
	if buffered, complete := st.Body(); complete {
		if len(buffered) > 0 {
			try.body = bytes.Clone(buffered)
			req.ContentLength = int64(len(buffered))
		}
	} else {
		// The body streams from the client: it is sent once.
		body = &h2StreamBody{st: st}
		defer body.stop()
		req.Body, req.ContentLength = body, st.ContentLength()
		if req.ContentLength < 0 {
			req.ContentLength = -1
		}
		try.replayable = false
	}
	reply, err := u.roundTrip(lv, rt, start, &try)
	out.retries = reply.retries
	out.upAddr = reply.endpoint
	if err != nil {
		u.wc.RecordRequest(start, false)
		if streamEnded(st) {
			return
		}
		status, msg := exchange.FailureStatus(err)
		if log := cc.m.log; log.IsDebug() {
			log.Debug("HTTP/2 upstream request failed", "cluster", u.wc.Name(), "status", status, "error", err)
		}
		out.status = streamReply(st, s, cc.st, status, msg)
		if body != nil {
			body.headSent = true
		}
		return
	}
	defer reply.done()
	resp := reply.resp
	u.wc.RecordRequest(start, true)
	s.fields = s.fields[:0]
	for k, vs := range resp.Header {
		if h2HopByHop(k) {
			continue
		}
		name := strings.ToLower(k)
		for _, v := range vs {
			s.fields = append(s.fields, hpack.HeaderField{Name: name, Value: v})
		}
	}
	if resp.ContentLength >= 0 && req.Method != "HEAD" {
		s.scratch = appendInt(s.scratch[:0], resp.ContentLength)
		s.fields = append(s.fields, hpack.HeaderField{Name: "content-length", Value: bytesString(s.scratch)})
	}
	cc.st.status(resp.StatusCode)
	out.status = resp.StatusCode
	if body != nil {
		body.headSent = true
	}
	if err := st.WriteHeaders(resp.StatusCode, s.fields, false); err != nil {
		return
	}
	sent, err := copyToStream(st, resp.Body)
	out.sent = sent
	if err != nil {
		resetStream(st) // the client must not take it for a whole response
		return
	}
	if len(resp.Trailer) > 0 {
		s.fields = s.fields[:0]
		for k, vs := range resp.Trailer {
			name := strings.ToLower(k)
			for _, v := range vs {
				s.fields = append(s.fields, hpack.HeaderField{Name: name, Value: v})
			}
		}
		st.WriteTrailers(s.fields)
	}
}

// copyToStream copies an upstream body to the client, flushing after
// each read: nothing the upstream sent waits in the proxy.
func copyToStream(st *h2.Stream, body io.Reader) (int64, error) {
	buf := getBuf()
	defer putBuf(buf)
	var sent int64
	for {
		n, err := body.Read(buf)
		if n > 0 {
			w, werr := st.Write(buf[:n])
			sent += int64(w)
			if werr != nil {
				return sent, werr
			}
			st.Flush()
		}
		if err == io.EOF {
			return sent, nil
		}
		if err != nil {
			return sent, err
		}
	}
}

// h2StreamBody is a streamed request body as x/net's transport reads it,
// on a goroutine of the transport's that may outlive the request: stop,
// before ServeH2 returns, ends its use of the stream (which the engine
// then reuses).
type h2StreamBody struct {
	st       *h2.Stream
	mu       sync.Mutex // held by Read; stop takes it to wait Read out
	stopped  bool
	eof      atomic.Bool
	headSent bool // a response head went to the client (ServeH2's goroutine)
}

func (b *h2StreamBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return 0, errBodyStopped
	}
	n, err := b.st.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	} else if err != nil {
		err = errClientBody
	}
	return n, err
}

func (b *h2StreamBody) Close() error { return nil }

// stop unblocks a Read waiting for the client (the stream is reset, its
// response complete) and waits it out.
func (b *h2StreamBody) stop() {
	if !b.eof.Load() {
		if b.headSent {
			b.st.CloseWrite()
		}
		b.st.Reset(http2.ErrCodeNo)
	}
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
}
