package httpfront

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The idle poller (issue 22, item 3): a plaintext HTTP/1.1 keep-alive
// connection that has been idle for the park grace (ParkIdleAfter; the
// worker's park sweep asks it: Conn.AskToPark) gives its goroutine back
// and parks its socket here until the client sends its next request, so
// that an idle connection costs its structs and its kernel socket, not a
// stack, and a busy one never comes here.
//
// One poller per worker (its connection set's), made at the first park:
// an epoll instance of our own, in which a parked socket is registered
// one-shot. Go's runtime keeps the same socket in its own epoll
// (edge-triggered, registered when the connection was accepted); Linux
// allows both, and as no goroutine waits on the socket while it is parked,
// the runtime's wake finds nobody and costs nothing but the event. The
// poller's own epoll fd is non-blocking and wrapped in an os.File, so the
// runtime's netpoller tells the poller's goroutine when it has events: no
// thread is blocked in epoll_wait.
//
// Race-freedom, by the connection's park state (parking.state, h1conn.go):
//   - park sets every field the wake reads, then stateArming, then arms the
//     socket (EPOLL_CTL_MOD, or ADD the first time), then stateParked if
//     nobody marked it meanwhile. From stateParked on the connection's
//     goroutine touches nothing of it: whoever turns it back to running
//     (a wake, Close, the idle timer) owns it. A wake or Close during the
//     arm marks it stateWokenArming, and the goroutine reads on itself.
//   - A wake takes it (Conn.take) and hands it to a resumer
//     goroutine, which runs serveRequests. An arm checks
//     the socket's readiness itself (ep_modify polls the file), so bytes
//     that came before the arm still wake it: no peek, and a deferred
//     response (Conn.pending) can simply be written before parking.
//   - Close closes the socket (the kernel drops it from every epoll when
//     the last reference goes) and takes it the same way, then hands
//     the connection to a resumer: its read fails, and it ends on a
//     goroutine as every connection does (Listener.ConnWG, access log, Host.Closed).
//   - Epoll data cannot hold a Go pointer; it holds a token, the
//     connection's slot here and a sequence number, so that an event read
//     just before a close does not wake the next connection in that slot.
type idlePoller struct {
	mu      sync.Mutex // guards the fields below, once per connection, never per request
	started bool
	stopped bool
	file    *os.File        // the epoll fd, for the runtime's netpoller
	raw     syscall.RawConn // file's
	seq     uint32          // tokens' sequence numbers
	free    []uint32        // slots free for the next connection
	nslots  uint32          // slots handed out so far

	// slots hold the connections that have a slot, by index: chunks made
	// once, never moved, so the poller's goroutine reads them without
	// the lock. Made with the poller (a worker that never parks pays
	// nothing for it), before anything reads it.
	slots *[idleSlotChunks]atomic.Pointer[idleSlotChunk]

	resume       chan *Conn        // to a resumer waiting in resumeLoop
	stop         chan struct{}     // closed by close: resumers and the wait end
	idleResumers atomic.Int32      // resumers waiting on resume
	events       []unix.EpollEvent // the poller goroutine's
	waitFn       func(fd uintptr) bool
}

const (
	idleSlotChunkSize = 1024
	idleSlotChunks    = 4096 // 4M parked connections per worker
	// MaxIdleResumers is how many resumers wait for a wake; a goroutine
	// coming back to the pool when that many wait ends instead, so a
	// burst's goroutines do not stay.
	MaxIdleResumers = 64
)

type idleSlotChunk [idleSlotChunkSize]atomic.Pointer[parking]

// errIdlePollerClosed: the worker is closing; the connection waits in its
// own goroutine.
var errIdlePollerClosed = errors.New("idle poller closed")

// startLocked makes the epoll instance and starts the poller's goroutine.
func (p *idlePoller) startLocked() error {
	if p.stopped {
		return errIdlePollerClosed
	}
	if p.started {
		return nil
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		p.stopped = true
		return fmt.Errorf("idle poller: epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		p.stopped = true
		return fmt.Errorf("idle poller: set epoll fd non-blocking: %w", err)
	}
	p.file = os.NewFile(uintptr(epfd), "idle-poller")
	raw, err := p.file.SyscallConn()
	if err != nil {
		p.file.Close()
		p.stopped = true
		return fmt.Errorf("idle poller: %w", err)
	}
	p.resume = make(chan *Conn)
	p.stop = make(chan struct{})
	p.raw = raw
	p.slots = new([idleSlotChunks]atomic.Pointer[idleSlotChunk])
	p.events = make([]unix.EpollEvent, 128)
	p.waitFn = p.handleEvents
	p.started = true
	go func() {
		// The callback never reports done: Read returns only when close
		// closes the file.
		raw.Read(p.waitFn)
	}()
	return nil
}

// assign gives pk a slot and its token; false: no poller.
func (p *idlePoller) assign(pk *parking) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.startLocked() != nil {
		return false
	}
	var idx uint32
	if n := len(p.free); n > 0 {
		idx = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		if p.nslots == idleSlotChunkSize*idleSlotChunks {
			return false
		}
		idx = p.nslots
		p.nslots++
		if idx%idleSlotChunkSize == 0 {
			p.slots[idx/idleSlotChunkSize].Store(new(idleSlotChunk))
		}
	}
	p.seq++
	pk.token = uint64(idx) | uint64(p.seq)<<32
	pk.slot = idx + 1
	p.slots[idx/idleSlotChunkSize].Load()[idx%idleSlotChunkSize].Store(pk)
	return true
}

// release frees pk's slot, at the connection's end.
func (p *idlePoller) release(pk *parking) {
	if pk.slot == 0 {
		return
	}
	idx := pk.slot - 1
	pk.slot = 0
	p.slots[idx/idleSlotChunkSize].Load()[idx%idleSlotChunkSize].Store(nil)
	p.mu.Lock()
	p.free = append(p.free, idx)
	p.mu.Unlock()
}

// park registers pk's socket in the poller: parkParked, the connection
// belongs to the poller now and its goroutine must not touch it;
// parkWoken, it was woken (or closed) while being armed and its goroutine
// reads on; parkFailed, it could not be parked and its goroutine waits as
// before.
func (p *idlePoller) park(pk *parking) parkResult {
	if pk.slot == 0 && !p.assign(pk) {
		return parkFailed
	}
	if pk.armOuterFn == nil {
		pk.armOuterFn, pk.armInnerFn = pk.armInEpoll, pk.armSocket
	}
	pk.armOp = unix.EPOLL_CTL_MOD
	if !pk.added {
		pk.armOp = unix.EPOLL_CTL_ADD
	}
	pk.armErr = nil
	// While arming, a wake or a Close only marks the connection
	// (stateArming to stateWokenArming): the goroutine still owns it, and
	// the fields the arm writes.
	pk.state.Store(stateArming)
	// Both fds inside Control, so that neither can be closed (and its
	// number reused) during the epoll_ctl.
	err := p.raw.Control(pk.armOuterFn)
	if err == nil {
		err = pk.armErr
	}
	if err == nil {
		pk.added = true
		if pk.state.CompareAndSwap(stateArming, stateParked) {
			return parkParked
		}
	} else if pk.state.CompareAndSwap(stateArming, stateRunning) {
		// Not armed (a closed socket, a closing poller): the
		// goroutine's own wait sees what happened.
		return parkFailed
	}
	pk.state.Store(stateRunning)
	return parkWoken
}

// take turns a parked connection to running for whoever calls it: true,
// the caller owns it (and hands it to a resumer). A connection still
// being armed is marked instead, and its goroutine reads on.
func (pk *parking) take() bool {
	for {
		switch pk.state.Load() {
		case stateParked:
			if pk.state.CompareAndSwap(stateParked, stateRunning) {
				return true
			}
		case stateArming:
			if pk.state.CompareAndSwap(stateArming, stateWokenArming) {
				return false
			}
		default:
			return false
		}
	}
}

// armInEpoll and armSocket are park's Control callbacks, on the poller's
// epoll fd and then on the socket.
func (pk *parking) armInEpoll(epfd uintptr) {
	pk.armEpfd = int(epfd)
	if err := pk.cc.raw.Control(pk.armInnerFn); err != nil {
		pk.armErr = err
	}
}

func (pk *parking) armSocket(fd uintptr) {
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     int32(uint32(pk.token)),
		Pad:    int32(uint32(pk.token >> 32)),
	}
	err := unix.EpollCtl(pk.armEpfd, pk.armOp, int(fd), &ev)
	if err == unix.ENOENT && pk.armOp == unix.EPOLL_CTL_MOD {
		err = unix.EpollCtl(pk.armEpfd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	}
	pk.armErr = err
}

// handleEvents is the poller goroutine's RawConn.Read callback: it reads
// every event there is and resumes their connections. It always reports
// not done, so Read waits for the epoll fd to be readable again: the
// runtime resets that readiness before calling it, and every event added
// to our ready list after that wakes the runtime's epoll again.
func (p *idlePoller) handleEvents(epfd uintptr) bool {
	for {
		n, err := unix.EpollWait(int(epfd), p.events, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return false
		}
		for i := range p.events[:n] {
			ev := &p.events[i]
			token := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			idx := uint32(token)
			chunk := p.slots[idx/idleSlotChunkSize].Load()
			if chunk == nil {
				continue
			}
			pk := chunk[idx%idleSlotChunkSize].Load()
			if pk == nil || pk.token != token || !pk.take() {
				continue // a connection that has ended, or been taken by Close
			}
			p.dispatch(pk.cc)
		}
		if n < len(p.events) {
			return false
		}
	}
}

// unpark takes cc back from the poller for Close or the idle timer; true:
// cc was parked and has been handed to a resumer to end.
func (p *idlePoller) unpark(cc *Conn) bool {
	pk := cc.parking.Load()
	if pk == nil || !pk.take() {
		return false
	}
	p.dispatch(cc)
	return true
}

// dispatch runs cc's requests on a waiting resumer, or a new one when
// none waits.
func (p *idlePoller) dispatch(cc *Conn) {
	select {
	case p.resume <- cc:
	default:
		go p.resumeLoop(cc)
	}
}

// resumeLoop serves cc until it parks or ends, then waits for the next
// woken connection, unless enough resumers wait already.
func (p *idlePoller) resumeLoop(cc *Conn) {
	for {
		cc.resume()
		if p.idleResumers.Load() >= MaxIdleResumers {
			return
		}
		p.idleResumers.Add(1)
		select {
		case cc = <-p.resume:
			p.idleResumers.Add(-1)
		case <-p.stop:
			p.idleResumers.Add(-1)
			return
		}
	}
}

// joinResumers makes a goroutine whose connection has just parked (the
// one accept started) a resumer, or lets it end.
func (p *idlePoller) joinResumers() {
	if p.idleResumers.Load() >= MaxIdleResumers {
		return
	}
	p.idleResumers.Add(1)
	select {
	case cc := <-p.resume:
		p.idleResumers.Add(-1)
		p.resumeLoop(cc)
	case <-p.stop:
		p.idleResumers.Add(-1)
	}
}

// close stops the poller: the waiting resumers end, and no connection
// parks any more. Called once every connection has been closed
// (connSet.killAll), so each parked one has been handed to a resumer.
func (p *idlePoller) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	if p.started {
		close(p.stop)
		p.file.Close()
	}
}

// ParkedSocketsSupported says whether idle connections park (tests).
const ParkedSocketsSupported = true
