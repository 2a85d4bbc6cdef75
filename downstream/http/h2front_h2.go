package httpfront

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/route"
)

// An HTTP/2 stream proxied to an HTTP/2 cluster, through the cluster's
// multiplexed pool (upstream.H2Pool, on h2's ClientConn) and the
// exchange core's HTTP/2 transport: the request head is built as header
// fields straight from the stream's (exchange.ForwardedFields decides
// what passes), a body the engine buffered whole goes with the HEADERS of
// every try, a streaming one (gRPC streams) is pumped once, and the
// response head, body and trailers are copied back as they come. A
// client that resets its stream resets the upstream one (CANCEL).

func (f *h2Front) proxyToHTTP2(st *h2.Stream, s *h2StreamState, lv *View, rt *route.Route, u *h2Upstream, start time.Time, out *outcome) {
	cc := f.cc
	x := &s.up
	x.Reset(u.pool, cc.l.Env.Ctx, h2HashKeyOf(&rt.HashOn, st, cc.clientIP))
	defer func() {
		x.Finish()
		x.Reset(nil, nil, 0) // the pool keeps no stream or pool
	}()
	host := h2Host(st)
	x.Head.Method, x.Head.Scheme, x.Head.Authority, x.Head.Path = st.Method(), u.pool.Scheme(), host, st.Path()
	fwd := &s.fwd
	fwd.Reset(cc.client(), stringBytes(host), true)
	for _, hf := range st.Fields() {
		if name, value := stringBytes(hf.Name), stringBytes(hf.Value); fwd.Take(name, value) {
			x.AddField(name, value)
		}
	}
	replayable := true
	var body *h2StreamBody
	// A whole body goes with the head, unless trailers came after it:
	// Head.Body carries none, the streamed body's Trailers do.
	if buffered, complete := st.Body(); complete && len(st.Trailers()) == 0 {
		x.Head.Body = buffered
		if len(buffered) > 0 || st.ContentLength() == 0 {
			x.AddOwnFields(fwd, int64(len(buffered)))
		} else {
			x.AddOwnFields(fwd, -1)
		}
	} else {
		// The body streams from the client: it is sent once.
		body = &s.body
		*body = h2StreamBody{st: st}
		defer body.stop()
		x.Body = body
		x.AddOwnFields(fwd, st.ContentLength())
		replayable = false
	}
	// The client's reset ends the tries and the response's copy.
	watch := &s.watch
	watch.start(st, x)
	defer watch.stop()

	t := &s.tries
	t.Start(&rt.Retry, u.wc, start, rt.Timeout, replayable, exchange.Idempotent(x.Head.Method))
	err := x.Run(t, u.wc)
	out.retries = t.Retries
	out.upAddr = x.Up.Addr
	if err != nil {
		u.wc.RecordRequest(start, false)
		if streamEnded(st) {
			return
		}
		status, msg := exchange.FailureStatus(err)
		if log := cc.l.Env.Log; log.IsDebug() {
			log.Debug("HTTP/2 upstream request failed", "cluster", u.wc.Name(), "status", status, "error", err)
		}
		out.status = streamReply(st, s, cc.st, status, msg)
		if body != nil {
			body.headSent = true
		}
		return
	}
	u.wc.RecordRequest(start, true)
	up := x.Up.Stream
	isHead := x.Head.Method == "HEAD"
	s.fields = s.fields[:0]
	for _, hf := range x.Fields {
		if isHead && hf.Name == "content-length" {
			continue // as before: a HEAD response's length is not sent on
		}
		s.fields = append(s.fields, hf)
	}
	cc.st.Status(x.Status)
	out.status = x.Status
	if body != nil {
		body.headSent = true
	}
	if up.HeadEndedStream() {
		// No body, no trailers: one HEADERS with END_STREAM (gRPC's
		// trailers-only response keeps its form).
		st.WriteHeaders(x.Status, s.fields, true)
		return
	}
	if err := st.WriteHeaders(x.Status, s.fields, false); err != nil {
		return
	}
	sent, err := copyToStream(st, up)
	out.sent = sent
	if err != nil {
		resetStream(st) // the client must not take it for a whole response
		return
	}
	// The response trailer rule: no framing or routing field (the
	// HTTP/2 codec refuses the hop-by-hop ones); grpc-status passes.
	// None left: the stream ends as if there were none.
	if tr := exchange.KeepResponseTrailers(up.Trailers()); len(tr) > 0 {
		st.WriteTrailers(tr)
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

// h2ResetWatch resets the upstream stream when the client resets its
// own: a goroutine per exchange that waits for either the stream's end or
// stop. Its channel is kept with the stream's pooled state.
type h2ResetWatch struct {
	stopc chan struct{} // unbuffered: stop returns once the watcher has let go
	on    bool
}

func (w *h2ResetWatch) start(st *h2.Stream, x *exchange.H2Transport) {
	if w.stopc == nil {
		w.stopc = make(chan struct{})
	}
	w.on = true
	go w.run(st.Done(), w.stopc, x)
}

func (w *h2ResetWatch) run(reset <-chan struct{}, stopc chan struct{}, x *exchange.H2Transport) {
	select {
	case <-reset:
		x.Cancel()
		<-stopc
	case <-stopc:
	}
}

// stop ends the watcher, before the transport is finished.
func (w *h2ResetWatch) stop() {
	if w.on {
		w.on = false
		w.stopc <- struct{}{}
	}
}

// h2StreamBody is a streamed request body as the transport's pump reads
// it, on a goroutine of its own: stop, before ServeH2 returns, ends its
// use of the stream (which the engine then reuses).
type h2StreamBody struct {
	st       *h2.Stream
	mu       sync.Mutex // held by Read; stop takes it to wait Read out
	stopped  bool
	eof      atomic.Bool
	headSent bool // a response head went to the client (ServeH2's goroutine)
}

var _ exchange.H2Body = (*h2StreamBody)(nil)

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

// Trailers are the client's request trailers (gRPC clients send none,
// others may), once Read returned io.EOF.
func (b *h2StreamBody) Trailers() []hpack.HeaderField { return b.st.Trailers() }

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
