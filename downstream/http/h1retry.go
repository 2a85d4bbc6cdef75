package httpfront

import (
	"bytes"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
)

// tryUntilResponse sends the request (head b, then bodyRef) and, when its
// body is complete, reads the response head; it sends it again where the
// route's retry policy (exchange.Tries) says so, to another endpoint
// where there is one. On return, x.up is the connection of the last try
// (nil if none connected) and, on success, cc.ex.resp its response head
// (with a body that streams from the client, its pump running). A try
// is repeated only while the whole request is in b and bodyRef
// (x.bodyDone: nothing streams from the client), or, on a stale pooled
// connection, nothing of the streamed body was taken yet; and nothing
// of a response reached the client. A response it repeats is read no
// further and its connection closed.
func (x *h1Exchange) tryUntilResponse(lv *View, rt *route.Route, b, bodyRef []byte) error {
	t := &x.tries
	t.Start(&rt.Retry, x.wc, x.start, rt.Timeout, x.bodyDone, x.idempotent)
	x.out, x.outBody = b, bodyRef
	x.key = x.cc.hashKey(&rt.HashOn, x.head)
	err := exchange.RoundTrip(t, x)
	x.retries = t.Retries
	if err == nil && x.bodyDone && t.PerTry() {
		// The body is read within the request deadline, no longer the
		// try's.
		x.up.SetDeadline(t.Deadline())
	}
	return err
}

var _ exchange.UpstreamTransport = (*h1Exchange)(nil)

// Try sends the request once on a connection of the cluster's pool
// (exchange.UpstreamTransport) and, when its body is complete, reads the
// response head.
func (x *h1Exchange) Try(n, avoid int, fresh bool, tryDeadline time.Time) (int, exchange.Try, error) {
	// A stale pooled connection is caught by the retry of
	// exchange.Tries, for a request that can be sent twice; any other
	// takes a checked one.
	var err error
	x.up, err = x.wc.AcquireTry(x.cc.l.Env.Ctx, x.key, n, avoid, fresh, x.idempotent && x.bodyDone)
	if err != nil {
		x.up = nil
		return 0, exchange.Try{Endpoint: -1, Interim: x.interim}, err
	}
	x.up.SetTryDeadline(tryDeadline, x.tries.DeadlineSlack())
	status := 0
	unsent := false
	if x.bodyDone {
		// The whole request goes with its head: written from inside
		// the wait for the answer (sendThenReadHead). A stale pooled
		// connection shows itself now, as EOF or a reset.
		err = x.sendThenReadHead(x.out, x.outBody)
	} else if err = x.sendHead(x.out, x.outBody); err == nil {
		// The rest of the body streams from the client while the
		// response head is awaited: a 100 Continue reaches the client
		// first, an early answer (401, 413) at once.
		x.startPump()
		err = x.readResponseHead()
	}
	stale := x.up.Reused() && x.in.W == 0
	if err != nil && !x.bodyDone && stale {
		// A stale connection with the body still to come: stopped,
		// the pump tells whether any of it was taken from the
		// client. None (an Expect: 100-continue client waits): the
		// request may go again on a fresh connection.
		if perr := x.waitPump(true); perr != nil {
			err = perr
		}
		unsent = !x.bodyTaken
	}
	if err == nil {
		status = int(x.cc.ex.resp.Status)
	}
	return status, exchange.Try{Endpoint: x.up.EndpointIndex(), Stale: stale, BodyUnsent: unsent, Interim: x.interim}, err
}

// Abandon closes the try's connection, its body pump stopped first: a
// response to repeat is read no further.
func (x *h1Exchange) Abandon() {
	x.waitPump(true)
	x.stop.Store(false)
	exchange.AbandonHTTP1(&x.up, &x.in)
}

// hashKey finds the request's hash_on key (upstream.HashKey; 0: the
// request has none) without allocating.
func (cc *Conn) hashKey(h *route.HashSource, head []byte) uint64 {
	req := &cc.ex.req
	switch h.Kind {
	case route.HashSourceIP:
		return upstream.HashKey(cc.clientIP)
	case route.HashHeader:
		for i := range req.NFields {
			f := &req.Fields[i]
			if http1.EqualFold(f.Name.Bytes(head), h.Name) {
				return upstream.HashKey(f.Value.Bytes(head))
			}
		}
	case route.HashCookie:
		for i := range req.NFields {
			f := &req.Fields[i]
			if !http1.EqualFold(f.Name.Bytes(head), "cookie") {
				continue
			}
			if v, ok := cookieValue(f.Value.Bytes(head), h.Name); ok {
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
