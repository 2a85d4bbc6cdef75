package workers

import (
	"bytes"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// tryUntilResponse sends the request (head b, then bodyRef) and, when its
// body is complete, reads the response head; it sends it again where the
// route's retry policy (exchange.Tries) says so, to another endpoint
// where there is one. On return, x.up is the connection of the last try
// (nil if none connected) and, on success with x.bodyDone, cc.ex.resp its
// response head. A try is repeated only while the whole request is in b
// and bodyRef (x.bodyDone: nothing streams from the client) and nothing
// of a response reached the client; a response it repeats is read no
// further and its connection closed.
func (x *h1Exchange) tryUntilResponse(lv *listenerView, rt *route, b, bodyRef []byte) error {
	cc := x.cc
	t := &x.tries
	t.Start(&rt.retry, x.wc, x.start, rt.timeout, x.bodyDone, x.idempotent)
	key := cc.hashKey(&rt.hashOn, x.head)
	prev, fresh := -1, false
	for attempt := 0; ; attempt++ {
		var err error
		switch {
		case attempt == 0:
			// A stale pooled connection is caught by the retry below,
			// for a request that can be sent twice; any other takes a
			// checked one.
			x.up, err = x.wc.AcquireKey(cc.m.ctx, key, !(x.idempotent && x.bodyDone))
		case fresh:
			x.up, err = x.wc.AcquireFresh(cc.m.ctx, prev)
		default:
			x.up, err = x.wc.AcquireRetry(cc.m.ctx, key, prev)
		}
		try := exchange.Try{Endpoint: -1, Interim: x.interim}
		status := 0
		if err != nil {
			x.up = nil
		} else {
			x.up.SetDeadline(t.TryDeadline())
			err = x.sendHead(b, bodyRef)
			if err == nil && x.bodyDone {
				// The response head may already be there; a stale
				// pooled connection shows itself now, as EOF or a
				// reset.
				err = x.readResponseHead()
			}
			if err == nil && x.bodyDone {
				status = int(cc.ex.resp.Status)
			}
			try.Endpoint, try.Interim = x.up.EndpointIndex(), x.interim
			try.Stale = x.up.Reused() && x.uw == 0
		}
		verdict := t.Next(err, status, try)
		x.retries = t.Retries
		switch verdict {
		case exchange.Accept:
			if x.bodyDone && t.PerTry() {
				// The body is read within the request deadline, no
				// longer the try's.
				x.up.SetDeadline(t.Deadline())
			}
			return nil
		case exchange.Fail:
			return err
		}
		prev, fresh = try.Endpoint, verdict == exchange.RetryFresh
		if x.up != nil {
			x.up.Discard()
			x.up = nil
		}
		x.ur, x.uw = 0, 0
	}
}

// hashKey finds the request's hash_on key (upstream.HashKey; 0: the
// request has none) without allocating.
func (cc *clientConn) hashKey(h *hashSource, head []byte) uint64 {
	req := &cc.ex.req
	switch h.kind {
	case hashSourceIP:
		return upstream.HashKey(cc.clientIP)
	case hashHeader:
		for i := range req.NFields {
			f := &req.Fields[i]
			if http1.EqualFold(f.Name.Bytes(head), h.name) {
				return upstream.HashKey(f.Value.Bytes(head))
			}
		}
	case hashCookie:
		for i := range req.NFields {
			f := &req.Fields[i]
			if !http1.EqualFold(f.Name.Bytes(head), "cookie") {
				continue
			}
			if v, ok := cookieValue(f.Value.Bytes(head), h.name); ok {
				return upstream.HashKey(v)
			}
		}
	}
	return 0
}

// cookieValue returns the value of cookie name in a Cookie header's value
// ("a=1; session=xyz"), without allocating.
func cookieValue(header []byte, name string) ([]byte, bool) {
	for len(header) > 0 {
		pair := header
		if i := bytes.IndexByte(header, ';'); i >= 0 {
			pair, header = header[:i], header[i+1:]
		} else {
			header = nil
		}
		pair = bytes.TrimLeft(pair, " \t")
		if len(pair) > len(name) && pair[len(name)] == '=' && string(pair[:len(name)]) == name {
			return bytes.TrimRight(pair[len(name)+1:], " \t"), true
		}
	}
	return nil, false
}
