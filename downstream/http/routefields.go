package httpfront

import (
	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
)

// The two front ends' route.RequestFields: what a route's header
// matches read, over the head each front end already parsed.

// RequestField reads the HTTP/1.1 request head being handled, in place in
// the read buffer.
func (cc *Conn) RequestField(name string, n int) (string, bool) {
	req := &cc.ex.req
	head := cc.rbuf[cc.r:cc.w]
	if name == route.MethodField {
		return bytesString(req.Method.Bytes(head)), n == 0
	}
	for i := range req.NFields {
		f := &req.Fields[i]
		if http1.EqualFold(f.Name.Bytes(head), name) {
			if n == 0 {
				return bytesString(f.Value.Bytes(head)), true
			}
			n--
		}
	}
	return "", false
}

// h2RequestFields reads an HTTP/2 stream's request head (its field names
// are lower case: the engine refuses any other). Its "host" is the
// authority, as an HTTP/1.1 request's Host is, so that a route matching
// host matches both alike.
type h2RequestFields h2.Stream

func (f *h2RequestFields) RequestField(name string, n int) (string, bool) {
	st := (*h2.Stream)(f)
	switch name {
	case route.MethodField:
		return st.Method(), n == 0
	case "host":
		// The engine has checked that :authority and a host field
		// agree; there is one value.
		h := h2Host(st)
		return h, n == 0 && h != ""
	}
	for _, hf := range st.Fields() {
		if hf.Name == name {
			if n == 0 {
				return hf.Value, true
			}
			n--
		}
	}
	return "", false
}

var (
	_ route.RequestFields = (*Conn)(nil)
	_ route.RequestFields = (*h2RequestFields)(nil)
)
