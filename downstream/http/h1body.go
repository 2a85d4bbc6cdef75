package httpfront

import (
	"net"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
)

// inlineBodyMax: a Content-Length body up to this size that is already
// buffered is copied behind the head, so both go in one write.
const inlineBodyMax = 8 << 10

// takeBufferedBody moves the body bytes already read from the client to
// the upstream request: appended to b (small, or re-encoded chunks), or as
// bodyRef, a slice of rbuf written right after b. It sets bodyDone, or
// what is left for the pump.
func (x *h1Exchange) takeBufferedBody(b []byte) (_ []byte, bodyRef []byte, err error) {
	cc := x.cc
	req := &cc.ex.req
	switch req.Framing {
	case http1.FramingNone:
		x.bodyDone = true
	case http1.FramingLength:
		n := min(req.ContentLength, int64(cc.w-cc.r))
		if n <= inlineBodyMax {
			b = append(b, cc.rbuf[cc.r:cc.r+int(n)]...)
		} else {
			bodyRef = cc.rbuf[cc.r : cc.r+int(n)]
		}
		cc.r += int(n)
		x.bodyTaken = n > 0
		x.bodyLeft = req.ContentLength - n
		x.bodyDone = x.bodyLeft == 0
	case http1.FramingChunked:
		d := &cc.ex.reqChunks
		d.Reset()
		x.bodyLeft = -1
		for cc.r < cc.w {
			n, data, trailer, done, err := d.Next(cc.rbuf[cc.r:cc.w])
			if err != nil {
				return b, nil, errClientBody
			}
			if n == 0 {
				break
			}
			cc.r += n
			x.bodyTaken = true
			b = x.appendRequestChunk(b, data, trailer, done)
			if done {
				x.bodyDone = true
				break
			}
		}
	}
	return b, bodyRef, nil
}

// appendChunk re-encodes decoded chunked data: sizes are the proxy's own,
// never the client's.
func appendChunk(b, data, trailer []byte, done bool) []byte {
	if len(data) > 0 {
		b = http1.AppendChunkHeader(b, len(data))
		b = append(b, data...)
		b = append(b, "\r\n"...)
	}
	if done {
		b = http1.AppendLastChunk(b, trailer)
	}
	return b
}

// appendRequestChunk is appendChunk for the request body: its trailer is
// re-written field by field under the request trailer rule
// (exchange.ForwardedFields.AppendHTTP1RequestTrailer), never passed on
// as the client's bytes.
func (x *h1Exchange) appendRequestChunk(b, data, trailer []byte, done bool) []byte {
	b = appendChunk(b, data, nil, false)
	if done {
		b = append(b, "0\r\n"...)
		b = x.cc.ex.fwd.AppendHTTP1RequestTrailer(b, trailer)
		b = append(b, "\r\n"...)
	}
	return b
}

// sendHead writes the request head (and the body bytes taken with it).
func (x *h1Exchange) sendHead(b, bodyRef []byte) error {
	if len(bodyRef) == 0 {
		_, err := x.up.Write(b)
		return err
	}
	bufs := net.Buffers{b, bodyRef}
	_, err := x.up.WriteBuffers(&bufs)
	return err
}

// sendThenReadHead sends a request whose body is all in bodyRef (or
// which has none) and reads its response head, without the read(2) that
// would return EAGAIN right after the write (upstream.Conn.SendThenRead).
func (x *h1Exchange) sendThenReadHead(b, bodyRef []byte) error {
	if x.in.B == nil {
		x.in.B = x.cc.takeBuf(SmallBufSize)
	}
	if err := exchange.SendThenRead(x.up, b, bodyRef, &x.in, x); err != nil {
		return err
	}
	return x.readResponseHead()
}

// startPump streams the rest of the request body to the upstream on its
// own goroutine, so that an upstream answering early (401, 413) is heard
// while the client still sends. The pump owns rbuf until it reports.
func (x *h1Exchange) startPump() {
	x.pump = make(chan error, 1)
	go func() { x.pump <- x.pumpBody() }()
}

func (x *h1Exchange) pumpBody() (err error) {
	cc := x.cc
	defer func() {
		if err != nil {
			// Wake the response reader: the exchange cannot complete.
			x.up.SetReadDeadline(time.Now())
		}
	}()
	var out []byte
	if x.bodyLeft < 0 {
		out = getBuf()[:0]
		defer func() { putBuf(out) }()
	}
	upDeadline := time.Time{}
	writeUp := func(p []byte) error {
		if now := time.Now(); upDeadline.IsZero() || now.Sub(upDeadline) > -cc.settings.IdleTimeout+deadlineSlack {
			upDeadline = now.Add(cc.settings.IdleTimeout)
			x.up.SetWriteDeadline(upDeadline)
		}
		_, err := x.up.Write(p)
		return err
	}
	for {
		if x.bodyLeft == 0 {
			return nil
		}
		if x.bodyLeft > 0 && cc.r < cc.w {
			n := min(x.bodyLeft, int64(cc.w-cc.r))
			if n == x.bodyLeft {
				x.bodyRead.Store(true)
			}
			x.bodyTaken = true // even a write that fails may have sent some
			if err := writeUp(cc.rbuf[cc.r : cc.r+int(n)]); err != nil {
				return err
			}
			cc.r += int(n)
			x.bodyLeft -= n
			continue
		}
		if x.bodyLeft < 0 {
			d := &cc.ex.reqChunks
			for cc.r < cc.w {
				n, data, trailer, done, err := d.Next(cc.rbuf[cc.r:cc.w])
				if err != nil {
					return errClientBody
				}
				if n == 0 {
					break
				}
				cc.r += n
				x.bodyTaken = true
				if len(out)+len(data)+32 > cap(out) && len(out) > 0 {
					if err := writeUp(out); err != nil {
						return err
					}
					out = out[:0]
				}
				out = x.appendRequestChunk(out, data, trailer, done)
				if done {
					x.bodyLeft = 0
					x.bodyRead.Store(true)
					break
				}
			}
			if len(out) > 0 {
				if err := writeUp(out); err != nil {
					return err
				}
				out = out[:0]
			}
			if x.bodyLeft == 0 {
				return nil
			}
		}
		// Need more from the client.
		if !cc.roomForBody() {
			// A chunk-size line or trailer larger than the
			// buffer: the decoder refuses those first.
			return errClientBody
		}
		// Deadline first, then the stop flag: waitPump sets the flag and
		// then a deadline in the past, so either this sees the flag or
		// the read sees that deadline.
		cc.setReadDeadline(cc.settings.IdleTimeout)
		if x.stop.Load() {
			return errPumpStopped
		}
		if err := cc.read(); err != nil {
			if x.stop.Load() {
				return errPumpStopped
			}
			return errClientBody
		}
	}
}

// waitPump ends the body pump: stopped at once (stop) or waited for.
// It returns the pump's error.
func (x *h1Exchange) waitPump(stop bool) error {
	if x.pump == nil {
		return nil
	}
	if stop {
		x.stop.Store(true)
		x.cc.c.SetReadDeadline(aLongTimeAgo)
	}
	err := <-x.pump
	x.pump = nil
	// The pump set or the stop spoiled the read deadline: the next read
	// sets its own.
	x.cc.readDeadline = aLongTimeAgo
	if err == errPumpStopped {
		err = nil
	}
	return err
}

var aLongTimeAgo = time.Unix(1, 0)
