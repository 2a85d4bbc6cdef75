package exchange

import (
	"bytes"
	"io"
	"net"
	"time"

	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

// ReadBuffer is an HTTP/1.1 upstream connection's read buffer: B[R:W]
// has been read and not yet consumed.
type ReadBuffer struct {
	B    []byte
	R, W int
}

// HeadReadHooks is what ReadHTTP1Head asks of the front end whose request
// the response answers.
type HeadReadHooks interface {
	// GrowReadBuffer replaces the buffer, smaller than the largest
	// head, with one as large, holding its unread bytes at its start.
	GrowReadBuffer()
	// InterimResponse is given each interim response head (1xx but
	// 101): 100 Continue, 103 Early Hints. An HTTP/1.1 client gets it;
	// an HTTP/2 server answers Expect itself.
	InterimResponse(head []byte) error
	// ReadFailed returns the error a failed read of the upstream ends
	// the exchange with: the request body pump's, when it failed first
	// (the client's fault), before the read's.
	ReadFailed(err error) error
}

// ReadHTTP1Head reads from up into rb until resp holds the final response
// head (a status of 200 or more, or 101), parsed in place: its spans are
// of rb.B[rb.R:]. method is what the parser needs of the request's
// (HEAD changes the framing). A head larger than maxHead, the largest
// buffer, is a 502.
func ReadHTTP1Head(up io.Reader, rb *ReadBuffer, resp *http1.Response, method []byte, maxHead int, fe HeadReadHooks) error {
	// As for request heads: parse again only once a line has ended (or
	// the buffer is full), not after every read.
	parse := rb.R < rb.W
	for {
		err := http1.ErrIncomplete
		if parse {
			err = resp.Parse(rb.B[rb.R:rb.W], http1.Limits{MaxHeadBytes: maxHead}, method)
		}
		if err == http1.ErrIncomplete {
			if rb.W == len(rb.B) {
				switch {
				case rb.R > 0:
					rb.W = copy(rb.B, rb.B[rb.R:rb.W])
					rb.R = 0
				case len(rb.B) < maxHead:
					fe.GrowReadBuffer() // the head is parsed again
				default:
					return &http1.Error{Status: 502, Reason: "upstream response head too large"}
				}
			}
			n, err := up.Read(rb.B[rb.W:])
			rb.W += n
			if n == 0 {
				if err == nil {
					err = io.ErrNoProgress
				}
				return fe.ReadFailed(err)
			}
			parse = bytes.IndexByte(rb.B[rb.W-n:rb.W], '\n') >= 0 || rb.W == len(rb.B)
			continue
		}
		if err != nil {
			return err
		}
		if resp.Status >= 200 || resp.Status == 101 {
			return nil
		}
		interim := rb.B[rb.R : rb.R+resp.HeadLen]
		rb.R += resp.HeadLen
		if err := fe.InterimResponse(interim); err != nil {
			return err
		}
		parse = rb.R < rb.W
	}
}

// UpstreamReader is an HTTP/1.1 upstream connection as the core reads a
// response body from it (*upstream.Conn).
type UpstreamReader interface {
	io.Reader
	SetReadDeadline(t time.Time) error
}

// deadlineSlack: a read deadline is moved only when it is this far from
// where it should be, so that a busy connection resets its timer about
// once a second rather than on every read.
const deadlineSlack = time.Second

// ReadMore reads more of a response body from up into rb, after making
// room: a buffer smaller than maxBuf (the one the head was read into) is
// swapped for a large one (fe.GrowReadBuffer) at the first refill, a full
// one compacted. idle bounds the wait for the next bytes; *deadline is
// the read deadline last set (zero: none yet).
func ReadMore(up UpstreamReader, rb *ReadBuffer, maxBuf int, fe HeadReadHooks, deadline *time.Time, idle time.Duration) error {
	if rb.R == rb.W {
		rb.R, rb.W = 0, 0
	}
	if len(rb.B) < maxBuf {
		fe.GrowReadBuffer()
	} else if rb.W == len(rb.B) {
		rb.W = copy(rb.B, rb.B[rb.R:rb.W])
		rb.R = 0
	}
	if now := time.Now(); deadline.IsZero() || now.Add(idle).Sub(*deadline) > deadlineSlack {
		*deadline = now.Add(idle)
		up.SetReadDeadline(*deadline)
	}
	n, err := up.Read(rb.B[rb.W:])
	rb.W += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// PassesRepresentationLength reports whether a response's hop-by-hop
// field name still goes to the client: the Content-Length of a bodyless
// final response (HEAD, 304) describes the representation, not this
// message, and passes; a 204's never does (RFC 9110 §8.6).
func PassesRepresentationLength(name []byte, status int, bodyless bool) bool {
	return bodyless && status >= 200 && status != 204 && http1.EqualFold(name, "content-length")
}

// SendThenRead sends a request whose bytes are all in head and body
// (body may be empty) over up and reads what has come of the response
// into in.B[in.W:], without the read(2) that would return EAGAIN right
// after the write (upstream.Conn.SendThenRead). With in full it only
// sends, for the head reader to make room. A read that got nothing ends
// as fe.ReadFailed says, as the head reader's own read would. Both
// front ends' buffered requests go out through it.
func SendThenRead(up *upstream.Conn, head, body []byte, in *ReadBuffer, fe interface{ ReadFailed(error) error }) error {
	if in.W == len(in.B) {
		if len(body) == 0 {
			_, err := up.Write(head)
			return err
		}
		bufs := net.Buffers{head, body}
		_, err := up.WriteBuffers(&bufs)
		return err
	}
	n, werr, rerr := up.SendThenRead(head, body, in.B[in.W:])
	if werr != nil {
		return werr
	}
	in.W += n
	if n == 0 {
		return fe.ReadFailed(rerr)
	}
	return nil
}
