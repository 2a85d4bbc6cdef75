package workers

import (
	"sync"

	"github.com/hotproxy/hotproxy/workers/http1"
)

// ioBufs are the 32 KiB read buffers of client and upstream connections,
// taken for a request and given back when it is done (see ioBufSize).
var ioBufs = sync.Pool{New: func() any { return new([ioBufSize]byte) }}

func getBuf() []byte { return ioBufs.Get().(*[ioBufSize]byte)[:] }

func putBuf(b []byte) {
	if cap(b) == ioBufSize {
		ioBufs.Put((*[ioBufSize]byte)(b[:ioBufSize]))
	}
}

// h1State is what a connection needs only while it has a request in hand:
// parsed heads, write scratch. Pooled, so an idle connection holds none.
type h1State struct {
	req  http1.Request
	resp http1.Response
	wbuf []byte // request head to upstream, response head to client
	path []byte // the request path, cleaned for routing
	// The request body's decoder belongs to the body pump, the
	// response's to the connection's goroutine: both run at once.
	reqChunks  http1.ChunkedDecoder
	respChunks http1.ChunkedDecoder
	xchg       exchange
}

var h1States = sync.Pool{New: func() any {
	return &h1State{wbuf: make([]byte, 0, 4<<10), path: make([]byte, 0, 256)}
}}

func (cc *clientConn) takeState() {
	if cc.rbuf == nil {
		cc.rbuf = getBuf()
		cc.r, cc.w = 0, 0
	}
	if cc.ex == nil {
		cc.ex = h1States.Get().(*h1State)
	}
	cc.holdBuffers(cap(cc.rbuf) + cap(cc.ex.wbuf))
}

// releaseState gives the buffers back; only when nothing is buffered.
func (cc *clientConn) releaseState() {
	if cc.rbuf != nil && cc.r == cc.w {
		putBuf(cc.rbuf)
		cc.rbuf = nil
		cc.r, cc.w = 0, 0
	}
	if cc.ex != nil {
		cc.ex.wbuf = cc.ex.wbuf[:0]
		cc.ex.xchg = exchange{}
		h1States.Put(cc.ex)
		cc.ex = nil
	}
	if cc.rbuf == nil {
		cc.releaseBuffers()
	}
}
