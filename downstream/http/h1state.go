package httpfront

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
)

// Read buffers come in two sizes, each in its own pool. A request starts
// with a small one (SmallBufSize: most request heads, and most response
// heads, fit); it grows to the large one (IOBufSize) only for a head that
// does not fit or a body that streams through it, and whichever it holds
// goes back to its pool when the request is done. So a burst of small
// requests takes small buffers, and what it leaves in the pools goes at
// the next GCs (sync.Pool drops its contents over two of them; see
// workers/reclaim.go for what makes the heap give the pages back).
const SmallBufSize = 2 << 10

var (
	smallBufs = sync.Pool{New: func() any { return new([SmallBufSize]byte) }}
	ioBufs    = sync.Pool{New: func() any { return new([IOBufSize]byte) }}
)

// getBuf is a large buffer, for the transient users that stream: the
// re-chunking of a request body, the lingering close.
func getBuf() []byte { return ioBufs.Get().(*[IOBufSize]byte)[:] }

func getSmallBuf() []byte { return smallBufs.Get().(*[SmallBufSize]byte)[:] }

// putBuf gives b back to the pool of its size; a buffer of another size
// (a head larger than IOBufSize, growForHead) is left to the GC.
func putBuf(b []byte) {
	switch cap(b) {
	case IOBufSize:
		ioBufs.Put((*[IOBufSize]byte)(b[:IOBufSize]))
	case SmallBufSize:
		smallBufs.Put((*[SmallBufSize]byte)(b[:SmallBufSize]))
	}
}

// BufHolding counts the bytes of read buffers and request states that
// connections hold: per connection (what the overload manager's "reset
// the biggest buffer holders" ranks by, BufferBytes) and per worker (what
// the reclaimer watches for the end of a burst). The goroutine that takes
// or gives back a buffer counts it.
type BufHolding struct {
	_    [64]byte // apart from the worker's other fields, which other cores read
	held atomic.Int64
	peak atomic.Int64 // the most held at once since the reclaimer last looked
	_    [48]byte
}

// Sample returns the bytes held now and the most held at once since the
// last Sample (the reclaimer's look), which starts the next peak from now.
func (h *BufHolding) Sample() (held, peak int64) {
	held = h.held.Load()
	return held, h.peak.Swap(held)
}

func (h *BufHolding) Add(n int64) {
	v := h.held.Add(n)
	if n > 0 && v > h.peak.Load() {
		h.peak.Store(v) // a racy max is enough: the reclaimer wants the order of magnitude
	}
}

// h1StateBytes is what one pooled h1State costs, counted as held while a
// connection has it.
const h1StateBytes = int64(4<<10+256) + int64(unsafe.Sizeof(h1State{}))

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
	xchg       h1Exchange
	fwd        exchange.ForwardedFields // the upstream head's fields
	// toH2 is the exchange with an HTTP/2 upstream (h2upstream_h1.go),
	// made on first use: most connections never need one.
	toH2 *h1ToH2
}

var h1States = sync.Pool{New: func() any {
	return &h1State{wbuf: make([]byte, 0, 4<<10), path: make([]byte, 0, 256)}
}}

// takeBuf takes a pooled read buffer of size (SmallBufSize or IOBufSize)
// and counts it as held by the connection.
func (cc *Conn) takeBuf(size int) []byte {
	var b []byte
	if size == SmallBufSize {
		b = getSmallBuf()
	} else {
		b = getBuf()
	}
	cc.hold(int64(len(b)))
	return b
}

// giveBuf gives back a buffer takeBuf (or growRead) counted.
func (cc *Conn) giveBuf(b []byte) {
	cc.hold(-int64(len(b)))
	putBuf(b)
}

func (cc *Conn) hold(n int64) {
	cc.held.Add(n)
	cc.l.Worker.Bufs.Add(n)
}

// BufferBytes is what the connection holds now in read buffers (its own
// and its exchange's upstream one) and request state, in bytes: 0 while
// idle. Safe from any goroutine.
func (cc *Conn) BufferBytes() int64 { return cc.held.Load() }

func (cc *Conn) takeState() {
	if cc.rbuf == nil {
		cc.rbuf = cc.takeBuf(SmallBufSize)
		cc.r, cc.w = 0, 0
	}
	if cc.ex == nil {
		cc.ex = h1States.Get().(*h1State)
		cc.hold(h1StateBytes)
	}
	cc.holdBuffers(cap(cc.rbuf) + cap(cc.ex.wbuf))
}

// releaseState gives the buffers back; only when nothing is buffered.
func (cc *Conn) releaseState() {
	if cc.rbuf != nil && cc.r == cc.w {
		cc.giveBuf(cc.rbuf)
		cc.rbuf = nil
		cc.r, cc.w = 0, 0
	}
	if cc.ex != nil {
		cc.ex.wbuf = cc.ex.wbuf[:0]
		cc.ex.xchg = h1Exchange{}
		h1States.Put(cc.ex)
		cc.ex = nil
		cc.hold(-h1StateBytes)
	}
	if cc.rbuf == nil {
		cc.releaseBuffers()
	}
}

// endState is releaseState at the connection's end, when what is still
// buffered (bytes after a refused request, a request cut short) will never
// be read: the buffer is given back all the same, so that the workers'
// count of what is held (workers/reclaim.go) returns to zero.
func (cc *Conn) endState() {
	cc.r = cc.w
	cc.releaseState()
}

// growRead moves the unconsumed bytes rbuf[r:w] to the front of a buffer
// of size bytes (IOBufSize from its pool, anything larger made for the
// rare head that needs it) and gives the old one back. Every span into
// rbuf is stale after it: the callers parse again (readHead) or hold no
// span (a body refill, with everything before r consumed).
func (cc *Conn) growRead(size int) {
	var nb []byte
	if size == IOBufSize {
		nb = cc.takeBuf(IOBufSize)
	} else {
		nb = make([]byte, size)
		cc.hold(int64(size))
	}
	cc.w = copy(nb, cc.rbuf[cc.r:cc.w])
	cc.r = 0
	cc.giveBuf(cc.rbuf)
	cc.rbuf = nb
}

// roomForBody makes room in rbuf for the next read of a request body: a
// body streams through the large buffer (a small one would cost a read
// per 2 KiB, and would refuse a chunk line or trailer that the large one
// holds). false: rbuf is full of one unconsumed chunk line or trailer.
func (cc *Conn) roomForBody() bool {
	if cc.r == cc.w {
		cc.r, cc.w = 0, 0
	}
	switch {
	case len(cc.rbuf) < IOBufSize:
		cc.growRead(IOBufSize)
	case cc.w < len(cc.rbuf):
	case cc.r == 0:
		return false
	default:
		cc.compact()
	}
	return true
}
