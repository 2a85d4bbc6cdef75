package workers

import (
	"sync/atomic"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// Goroutines reused from one HTTP connection to the next. A new goroutine
// starts on an 8 KiB stack, and serving an HTTP/1.1 connection grows it
// (morestack, then a copy of the stack at each doubling): in the
// connection-per-request mode that was 4.3 % of hotproxy's CPU
// (docs/benchmarks.md). A goroutine whose connection has ended parks
// instead of exiting, its stack already grown, and the accept loop hands
// it the next connection; a new goroutine starts only when none is parked.
//
// Bounded two ways, so that an idle pool holds little memory: at most
// servePoolMax goroutines park per worker (one more exits at once), and
// the reclaimer's poll (reclaim.go) retires every goroutine parked at
// that moment, so a pool that no connection wants empties within
// reclaimPoll; under load the few goroutines it retires are started again,
// a handful per poll against thousands of connections. A drain waits on
// connections (httpWG), never on a parked goroutine: they exit when
// accepting stops.
const servePoolMax = 64

// servePool is one worker's parked connection goroutines.
type servePool struct {
	// handoff is unbuffered: a send that does not block finds a parked
	// goroutine waiting for it. A nil sent is a retirement.
	handoff chan *httpfront.Conn
	parked  atomic.Int32 // goroutines waiting on handoff, or about to
}

func newServePool() servePool { return servePool{handoff: make(chan *httpfront.Conn)} }

// serveHTTP serves cc on a parked goroutine of its worker, or on a new one.
// The caller has counted cc in httpWG; serve's end gives it back.
func (m *Manager) serveHTTP(wk *worker, cc *httpfront.Conn) {
	select {
	case wk.pool.handoff <- cc:
	default:
		go m.serveConns(&wk.pool, cc)
	}
}

// serveConns serves cc, then each connection the pool hands it, until the
// pool is full, retires it or accepting stops.
func (m *Manager) serveConns(p *servePool, cc *httpfront.Conn) {
	for cc != nil {
		cc.Serve()
		cc = p.park(m.stopAccept)
	}
}

// park waits for the next connection; nil: exit, because the pool has
// servePoolMax parked already, the reclaimer retired this goroutine or
// stop is closed.
func (p *servePool) park(stop <-chan struct{}) *httpfront.Conn {
	if p.parked.Add(1) > servePoolMax {
		p.parked.Add(-1)
		return nil
	}
	var cc *httpfront.Conn
	select {
	case cc = <-p.handoff:
	case <-stop:
	}
	p.parked.Add(-1)
	return cc
}

// retire makes the goroutines parked now exit, and returns how many did.
func (p *servePool) retire() int {
	n := 0
	for range p.parked.Load() {
		select {
		case p.handoff <- nil:
			n++
		default:
			return n
		}
	}
	return n
}
