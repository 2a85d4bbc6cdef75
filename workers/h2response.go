package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// readResponseHead reads until x.resp holds the final response head;
// interim responses (100 Continue, 103) are dropped: x/net answers Expect
// itself, when the handler first reads the body.
func (x *h2Exchange) readResponseHead() error {
	if x.in.B == nil {
		x.in.B = getBuf()
	}
	return exchange.ReadHTTP1Head(x.up, &x.in, &x.resp, x.method, ioBufSize, x)
}

var _ exchange.HeadReadHooks = (*h2Exchange)(nil)

// GrowReadBuffer is never asked for: the buffer is the largest already.
func (x *h2Exchange) GrowReadBuffer() {}

// InterimResponse drops a 1xx (exchange.HeadReadHooks).
func (x *h2Exchange) InterimResponse([]byte) error { return nil }

// ReadFailed prefers the body pump's error (exchange.HeadReadHooks).
func (x *h2Exchange) ReadFailed(err error) error { return exchange.PumpErrorOr(&x.pump, err) }

// startPump streams the request body to the upstream on a goroutine of
// its own, so that an upstream answering early is heard while the client
// still sends. It touches only the request body, the upstream connection
// and its own buffer: it may outlive the handler (an early response, the
// body still coming), and ends when the HTTP/2 server closes the body.
func (x *h2Exchange) startPump() {
	pump := make(chan error, 1)
	x.pump = pump
	up, body, trailer := x.up, x.r.Body, x.r.Trailer
	chunked := x.r.ContentLength < 0
	idle := x.h.cc.settings.idleTimeout
	go func() { pump <- pumpH2Body(up, body, trailer, chunked, idle) }()
}

func pumpH2Body(up *upstream.Conn, body io.Reader, trailer http.Header, chunked bool, idle time.Duration) (err error) {
	defer func() {
		if err != nil {
			// Wake the response reader: the exchange cannot complete.
			up.SetReadDeadline(time.Now())
		}
	}()
	buf := getBuf()
	defer putBuf(buf)
	var hdr []byte
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			up.SetWriteDeadline(time.Now().Add(idle))
			if chunked {
				hdr = http1.AppendChunkHeader(hdr[:0], n)
				bufs := net.Buffers{hdr, buf[:n], crlf}
				_, err = up.WriteBuffers(&bufs)
			} else {
				_, err = up.Write(buf[:n])
			}
			if err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			if chunked {
				// Request trailers are known once the body has ended.
				_, err = up.Write(http1.AppendLastChunk(hdr[:0], appendTrailer(nil, trailer)))
			}
			return err
		}
		if rerr != nil {
			return errClientBody
		}
	}
}

var crlf = []byte("\r\n")

// appendTrailer writes trailer fields as HTTP/1.1 field lines, leaving
// out those a trailer may not carry (framing, routing, hop-by-hop).
func appendTrailer(b []byte, trailer http.Header) []byte {
	for name, values := range trailer {
		switch name {
		case "Content-Length", "Transfer-Encoding", "Host", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade":
			continue
		}
		for _, v := range values {
			b = append(b, name...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// fail answers an exchange that failed before a response head went to
// the client, and settles the upstream connection.
func (x *h2Exchange) fail(w http.ResponseWriter, err error, start time.Time) int {
	st := x.h.cc.st
	if x.up != nil {
		if !errors.Is(err, errClientBody) && !errors.Is(err, context.Canceled) {
			x.wc.ReportStatus(x.up.EndpointIndex(), 0)
		}
		x.up.Discard()
		x.wc.RecordRequest(start, false)
	}
	if errors.Is(err, errClientBody) {
		return h2Answer(w, st, http.StatusBadRequest, "malformed or incomplete request body")
	}
	status, body := classify(err)
	if log := x.h.cc.m.log; log.IsDebug() {
		log.Debug("upstream request failed", "protocol", "HTTP/2.0", "status", status, "error", err)
	}
	return h2Answer(w, st, status, body)
}

// forwardResponse hands the parsed response and its body to the HTTP/2
// server and settles the upstream connection; false: the body was cut
// short after the head went out.
func (x *h2Exchange) forwardResponse(w http.ResponseWriter) bool {
	resp := &x.resp
	head := x.in.B[x.in.R : x.in.R+resp.HeadLen]
	x.in.R += resp.HeadLen
	hd := w.Header()
	bodyless := resp.Framing == http1.FramingNone
	for i := range resp.NFields {
		f := &resp.Fields[i]
		name := f.Name.Bytes(head)
		if f.Hop {
			// A HEAD or 304 response's Content-Length describes the
			// representation: it passes.
			if bodyless && resp.Status != 204 && http1.EqualFold(name, "content-length") {
				hd["Content-Length"] = []string{string(f.Value.Bytes(head))}
			}
			continue
		}
		if isProxyAuth(name) {
			continue
		}
		k := http.CanonicalHeaderKey(string(name))
		hd[k] = append(hd[k], string(f.Value.Bytes(head)))
	}
	if resp.Framing == http1.FramingLength {
		hd["Content-Length"] = []string{string(appendInt(nil, resp.ContentLength))}
	}
	x.h.cc.st.status(resp.Status)
	w.WriteHeader(resp.Status)

	var err error
	upClean := !resp.Close
	switch resp.Framing {
	case http1.FramingLength:
		err = x.copyLength(w, resp.ContentLength)
	case http1.FramingChunked:
		err = x.copyChunked(w)
	case http1.FramingUntilClose:
		err = x.copyUntilClose(w)
		upClean = false
	}
	if err != nil || x.in.R != x.in.W {
		upClean = false
	}
	if x.pump != nil {
		select {
		case perr := <-x.pump:
			x.pump = nil
			if perr != nil {
				upClean = false
			}
		default:
			// The response is complete and the request body is
			// not: the connection cannot carry another request.
			upClean = false
		}
	}
	x.up.Release(upClean)
	return err == nil
}

// readUpstream reads more of the response body into ub.
func (x *h2Exchange) readUpstream(deadline *time.Time) error {
	if x.in.R == x.in.W {
		x.in.R, x.in.W = 0, 0
	} else if x.in.W == len(x.in.B) {
		x.in.W = copy(x.in.B, x.in.B[x.in.R:x.in.W])
		x.in.R = 0
	}
	d := x.h.cc.settings.idleTimeout
	if now := time.Now(); deadline.IsZero() || now.Add(d).Sub(*deadline) > deadlineSlack {
		*deadline = now.Add(d)
		x.up.SetReadDeadline(*deadline)
	}
	n, err := x.up.Read(x.in.B[x.in.W:])
	x.in.W += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// write sends body bytes to the client and, with flush, sends them on:
// the proxy holds nothing back that the upstream has sent.
func (x *h2Exchange) write(w http.ResponseWriter, p []byte, flush bool) error {
	n, err := w.Write(p)
	x.sent += int64(n)
	if err != nil {
		return err
	}
	if f, ok := w.(http.Flusher); ok && flush {
		f.Flush()
	}
	return nil
}

func (x *h2Exchange) copyLength(w http.ResponseWriter, n int64) error {
	var deadline time.Time
	for n > 0 {
		if x.in.R == x.in.W {
			if err := x.readUpstream(&deadline); err != nil {
				return err
			}
		}
		k := min(n, int64(x.in.W-x.in.R))
		// The last bytes are not flushed: the handler's end sends them
		// in the frame that ends the stream.
		if err := x.write(w, x.in.B[x.in.R:x.in.R+int(k)], k < n); err != nil {
			return err
		}
		x.in.R += int(k)
		n -= k
	}
	return nil
}

func (x *h2Exchange) copyChunked(w http.ResponseWriter) error {
	d := &x.chunks
	d.Reset()
	var deadline time.Time
	for {
		for x.in.R < x.in.W {
			n, data, trailer, done, err := d.Next(x.in.B[x.in.R:x.in.W])
			if err != nil {
				return &http1.Error{Status: 502, Reason: "upstream sent a malformed chunked body"}
			}
			if n == 0 {
				break
			}
			if len(data) > 0 {
				if _, err := w.Write(data); err != nil {
					return err
				}
				x.sent += int64(len(data))
			}
			if done {
				setTrailers(w.Header(), trailer)
				x.in.R += n
				return nil
			}
			x.in.R += n
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if err := x.readUpstream(&deadline); err != nil {
			return err
		}
	}
}

// setTrailers sends a chunked body's trailer fields (validated by the
// decoder) as HTTP/2 trailers.
func setTrailers(hd http.Header, trailer []byte) {
	for len(trailer) > 0 {
		line := trailer
		if i := bytes.Index(trailer, crlf); i >= 0 {
			line, trailer = trailer[:i], trailer[i+2:]
		} else {
			trailer = nil
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			continue
		}
		name := http.CanonicalHeaderKey(string(line[:i]))
		hd[http.TrailerPrefix+name] = append(hd[http.TrailerPrefix+name], string(bytes.Trim(line[i+1:], " \t")))
	}
}

func (x *h2Exchange) copyUntilClose(w http.ResponseWriter) error {
	var deadline time.Time
	for {
		if x.in.R < x.in.W {
			if err := x.write(w, x.in.B[x.in.R:x.in.W], true); err != nil {
				return err
			}
			x.in.R = x.in.W
		}
		if err := x.readUpstream(&deadline); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
