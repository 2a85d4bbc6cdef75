package exchange

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/upstream"
)

// H2Body is a request body that streams from the client to an HTTP/2
// upstream, sent once (a request with one is never tried again): an
// HTTP/2 client's stream, an HTTP/1.1 client's body de-chunked.
type H2Body interface {
	// Read reads body bytes; io.EOF after the last one. Any other error
	// is the client's fault (ErrClientBody).
	Read(p []byte) (int, error)
	// Trailers are the request's trailers once Read returned io.EOF
	// (nil: none).
	Trailers() []hpack.HeaderField
}

// H2Transport is one request's tries on an HTTP/2 upstream: the
// UpstreamTransport over upstream.H2Pool. Each try opens a stream on an
// endpoint the pool's balancer picks, sends Head (and a buffered body
// with it), streams Body when there is one, and waits for the response
// head until the try's deadline; a per-try timeout or Cancel resets the
// stream with CANCEL. After RoundTrip accepted a try, Up.Stream is the
// response's (Status, Fields its head) until Finish.
//
// It is meant to live in a front end's per-request state: reset with
// Reset, its buffers and timer are kept, so a steady state allocates
// nothing for a request without a streamed body.
type H2Transport struct {
	Pool *upstream.H2Pool
	// Ctx ends dials (the worker's life).
	Ctx context.Context
	Key uint64 // hash_on key; 0: none
	// Head is the request. Head.Body is a body buffered whole, sent with
	// every try; Head.EndStream is set per try.
	Head h2.RequestHead
	// Body, when set, is a streamed body, pumped to the try's stream
	// while its response head is awaited.
	Body H2Body

	// The last try's stream and its response head.
	Up     upstream.H2Stream
	Status int
	Fields []hpack.HeaderField

	mu       sync.Mutex       // guards the fields below (the timer and Cancel run on other goroutines)
	live     *h2.ClientStream // the try's stream, which Cancel resets; nil: none
	waiting  bool             // live's head is awaited: a timeout resets it
	timedOut bool
	canceled bool
	pumpErr  error // the client's body failed (the pump's error)
	timer    *time.Timer
	pump     chan error // the body pump's result; nil: none runs

	scratch []byte // lower-cased names, content-length (AddField, AddOwnFields)
}

var _ UpstreamTransport = (*H2Transport)(nil)

// Reset readies x for a new request through pool, keeping its buffers.
func (x *H2Transport) Reset(pool *upstream.H2Pool, ctx context.Context, key uint64) {
	x.mu.Lock()
	x.live, x.waiting, x.timedOut, x.canceled, x.pumpErr = nil, false, false, false, nil
	x.mu.Unlock()
	x.Pool, x.Ctx, x.Key, x.Body = pool, ctx, key, nil
	x.Status, x.Fields = 0, nil
	x.scratch = x.scratch[:0]
	clear(x.Head.Fields) // the last request's strings: pin none of its buffers
	x.Head = h2.RequestHead{Fields: x.Head.Fields[:0]}
}

// Try opens the n-th try's stream and waits for its response head
// (avoid: the previous try's endpoint; the pool retries refused
// connections itself: fresh means nothing here).
func (x *H2Transport) Try(n, avoid int, _ bool, tryDeadline time.Time) (int, Try, error) {
	x.Head.EndStream = x.Body == nil
	x.mu.Lock()
	canceled := x.canceled
	x.mu.Unlock()
	if canceled {
		return 0, Try{Endpoint: -1}, fmt.Errorf("HTTP/2 upstream: the client went away: %w", context.Canceled)
	}
	err := x.Pool.Open(x.Ctx, x.Key, avoid, n > 0, tryDeadline, &x.Head, &x.Up)
	if err != nil {
		return 0, Try{Endpoint: x.Up.Endpoint}, err
	}
	s := x.Up.Stream
	x.arm(s, tryDeadline)
	if x.Body != nil {
		x.pump = make(chan error, 1)
		go x.pumpBody(s, x.pump)
	}
	status, fields, err := s.ResponseHead()
	timedOut, canceled := x.disarm()
	try := Try{Endpoint: x.Up.Endpoint}
	switch {
	case err == nil:
		x.Status, x.Fields = status, fields
		return status, try, nil
	case timedOut:
		err = fmt.Errorf("HTTP/2 upstream %s: no response head within the try's time: %w", x.Up.Addr, os.ErrDeadlineExceeded)
	case canceled:
		err = fmt.Errorf("HTTP/2 upstream %s: the client went away: %w", x.Up.Addr, context.Canceled)
	default:
		x.mu.Lock()
		if x.pumpErr != nil {
			err = x.pumpErr
		}
		x.mu.Unlock()
	}
	return 0, try, err
}

// arm makes s the live stream, which Cancel resets, and the one a
// timeout at deadline resets while its head is awaited.
func (x *H2Transport) arm(s *h2.ClientStream, deadline time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.live, x.waiting, x.timedOut = s, true, false
	if x.canceled {
		s.Reset(http2.ErrCodeCancel)
		return
	}
	if x.timer == nil {
		x.timer = time.AfterFunc(time.Until(deadline), x.onTimeout)
	} else {
		x.timer.Reset(time.Until(deadline))
	}
}

// disarm ends the wait for the head arm began and says whether a
// timeout or Cancel cut it.
func (x *H2Transport) disarm() (timedOut, canceled bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.timer != nil {
		x.timer.Stop()
	}
	x.waiting = false
	return x.timedOut, x.canceled
}

func (x *H2Transport) onTimeout() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.waiting && x.live != nil {
		x.timedOut = true
		x.live.Reset(http2.ErrCodeCancel)
	}
}

// Cancel is the client going away: the live stream (waiting for its
// head, or forwarding its response) is reset with CANCEL, and no further
// try starts. Safe from any goroutine, at any time until Finish.
func (x *H2Transport) Cancel() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.canceled = true
	if x.live != nil {
		x.live.Reset(http2.ErrCodeCancel)
	}
}

// pumpBody streams x.Body to s, then its trailers or END_STREAM, and
// sends its result on done: nil, or ErrClientBody when the client's body
// failed (the stream is then reset: the upstream must not take a cut
// body for a whole one). A write the upstream refused (it answered
// early, or reset the stream) ends the pump quietly: the response says
// what happened.
func (x *H2Transport) pumpBody(s *h2.ClientStream, done chan<- error) {
	buf := pumpBufs.Get().(*[pumpBufSize]byte)
	defer pumpBufs.Put(buf)
	for {
		n, err := x.Body.Read(buf[:])
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				done <- nil
				return
			}
		}
		switch {
		case err == io.EOF:
			// The client's trailers under the request trailer rule
			// (an empty list after it: END_STREAM alone).
			if tr := KeepRequestTrailers(x.Body.Trailers()); len(tr) > 0 {
				s.WriteTrailers(tr)
			} else {
				s.CloseSend()
			}
			done <- nil
			return
		case err != nil:
			// Recorded before the reset wakes the try, which then
			// tells the client's fault from the upstream's; sent on
			// done only after the last use of s (Finish releases it
			// once done is read).
			err = fmt.Errorf("%w: %v", ErrClientBody, err)
			x.mu.Lock()
			x.pumpErr = err
			x.mu.Unlock()
			s.Reset(http2.ErrCodeCancel)
			done <- err
			return
		}
	}
}

const pumpBufSize = 16 << 10

var pumpBufs = sync.Pool{New: func() any { return new([pumpBufSize]byte) }}

// Abandon gives up the last try for a retry: its stream is reset with
// CANCEL, its body pump (none: a try with a streamed body is never
// repeated) waited out.
func (x *H2Transport) Abandon() { x.Finish() }

// Finish ends the last try: a streamed body's pump is stopped (its
// stream reset) and waited out, so the body's source must already be
// stopped from blocking (the front end's job), then the stream is
// released and its endpoint's count ended. Idempotent.
func (x *H2Transport) Finish() {
	x.mu.Lock()
	x.live = nil
	x.mu.Unlock()
	if x.pump != nil && x.Up.Stream != nil {
		x.Up.Stream.Reset(http2.ErrCodeCancel)
		<-x.pump
		x.pump = nil
	}
	x.Up.Finish()
}

// AddField appends a request field the front end kept (ForwardedFields.
// Take said so) to Head, its name lower-cased as HTTP/2 wants (in x's own
// buffer: name and value must stay valid until the last try is sent).
func (x *H2Transport) AddField(name, value []byte) {
	x.Head.Fields = append(x.Head.Fields, hpack.HeaderField{Name: x.lower(name), Value: bytesString(value)})
}

// AddOwnFields appends the fields the proxy writes itself (fwd.Own) and,
// for a body of known length, content-length.
func (x *H2Transport) AddOwnFields(fwd *ForwardedFields, contentLength int64) {
	for {
		name, value, ok := fwd.Own()
		if !ok {
			break
		}
		// A request id is new for each request: indexing it would
		// only evict what repeats.
		x.Head.Fields = append(x.Head.Fields, hpack.HeaderField{Name: x.lower(stringBytes(name)), Value: bytesString(value), Sensitive: name == "X-Request-Id"})
	}
	if contentLength >= 0 {
		start := len(x.scratch)
		x.scratch = strconv.AppendInt(x.scratch, contentLength, 10)
		x.Head.Fields = append(x.Head.Fields, hpack.HeaderField{Name: "content-length", Value: bytesString(x.scratch[start:])})
	}
}

// lower returns name lower-cased: name itself when it is (an HTTP/2
// client's always are), else a copy in x.scratch. The strings handed out
// keep their bytes even when scratch grows (append copies; nothing
// written is overwritten until Reset).
func (x *H2Transport) lower(name []byte) string {
	upper := false
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			upper = true
			break
		}
	}
	if !upper {
		return bytesString(name)
	}
	start := len(x.scratch)
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		x.scratch = append(x.scratch, c)
	}
	return bytesString(x.scratch[start:])
}

func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// Run runs the request's tries through x (RoundTrip) and reports the
// outcome to outlier detection: the accepted response's status, or a
// failure after a connection was had that is the endpoint's (not a
// connect failure, counted by the dial; not the request's own deadline;
// not a refused stream the upstream never processed). On error the
// caller still calls Finish.
func (x *H2Transport) Run(t *Tries, acct Accounting) error {
	err := RoundTrip(t, x)
	if err != nil {
		var ce *upstream.ConnectError
		timedOut := IsTimeout(err) && !time.Now().Before(t.Deadline())
		if x.Up.Endpoint >= 0 && Blames(err) && !timedOut && !errors.As(err, &ce) && !h2.IsRetrySafe(err) {
			acct.ReportStatus(x.Up.Endpoint, 0)
		}
		return err
	}
	acct.ReportStatus(x.Up.Endpoint, x.Status)
	return nil
}
