package workers

import (
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"time"

	"github.com/hotproxy/hotproxy/downstream/tcp"
	"github.com/hotproxy/hotproxy/internal/rawsock"
)

// Accept back-off after a transient error (EMFILE, ENFILE, ECONNABORTED,
// ENOBUFS...): doubling from the first to the last, never giving up.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptor is one worker's accept loop on one socket.
type acceptor struct {
	m  *Manager
	ml *mlistener
	s  *socket
	wk *worker
	lw *listenerWorker // what wk holds of ml
	// raw takes an HTTP listener's connections (s.raw); nil for a TCP
	// listener, whose connections net accepts.
	raw *rawsock.Acceptor
	li  int // the listener's index (ml.idx)
	st  *listenerStats
	// slots bounds the listener's open connections (connlimit.go): every
	// connection accept returns holds one, which its close gives back.
	slots *connSlots
	// hb is the loop's heartbeat (heartbeat.go), stored every beatEvery
	// at least; nil: none kept.
	hb        *heartbeat
	beatEvery time.Duration
	// beatDeadline is the monotime of the listener deadline beat set
	// last (0: none yet).
	beatDeadline int64
	// lateSince is the monotime at which takeQueued first found the
	// drain's bound passed on a socket whose queue only shrinks (0: not
	// yet); it bounds the emptying from there (shrinkingQueueMax).
	lateSince int64
}

// accept returns the next connection, holding a connection slot that the
// connection's close must give back (connSlots.release). A connection over
// a max_connections bound is closed at once and counted, and the loop goes
// on. A transient error is logged (throttled) and retried after a
// back-off; out of descriptors, queued connections are first shed with the
// spare one (connBudget.shedOne). Once accepting stops in a drain, it
// hands out what is still queued on the socket (a closed listening socket
// resets its queue), then closes the socket and reports net.ErrClosed.
func (a *acceptor) accept() (acceptedConn, error) {
	var delay time.Duration
	for {
		a.beat()
		c, err := a.acceptOne()
		if err == nil {
			if a.admit(c) {
				return c, nil
			}
			continue
		}
		if a.ml.acceptStopped() {
			until := a.ml.emptyQueuesUntil.Load()
			if until == 0 {
				return nil, net.ErrClosed
			}
			if c := a.takeQueued(until); c != nil {
				if a.admit(c) {
					return c, nil
				}
				continue
			}
			// The queue is empty (or the time is up): close at once, so
			// that the moment in which a new connection could still be
			// queued, and then reset by the close, is as short as it
			// can be.
			if a.s.acceptors.Add(-1) == 0 {
				a.s.close()
			}
			return nil, net.ErrClosed
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() && a.hb != nil {
			continue // the heartbeat's deadline: nothing arrived
		}
		budget := a.m.budget
		delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
		if outOfDescriptors(err) {
			shed := budget.shedOne(a.s.ln)
			budget.outOfDescriptors.Warn("out of file descriptors: new connections are closed at once",
				"address", a.s.key.Address, "error", err,
				"hint", "raise the open-file limit (ulimit -n, systemd LimitNOFILE=) or lower server.max_connections")
			if shed {
				// More may be queued: shed them too, without waiting.
				a.st.cxOverflow.Inc()
				delay = 0
				continue
			}
		} else {
			budget.acceptErrors.Warn("accept failed; retrying", "address", a.s.key.Address, "worker", a.wk.id, "retry_in", delay, "error", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-a.ml.stopAccept:
			t.Stop()
		}
	}
}

// takeQueued returns a stopped loop's next connection: one queued on its
// socket (the kernel accepted it, and the socket's close would reset it)
// or one that completes its handshake meanwhile (awaitHandshakes); nil:
// close the socket now. Both end at until (queueDrainMax after accepting
// stopped), except where nothing new can enter the queue
// (queueOnlyShrinks): there until ends the wait for handshakes but not the
// emptying, and what is queued when it passes is still taken. A look for
// handshakes can outlast the whole bound on a loaded host, and the
// connections that completed during it were reset by the close: with
// ~50k TCP sockets in the namespace and both cores busy, one read of
// /proc/net/tcp (the look where the netlink one is refused) took 1.3 to
// 4.3s under the race detector (TestUpdateListenersRemovedUnderFlood/proc,
// TestUpdateListenersRemovedAfterSlowLook).
func (a *acceptor) takeQueued(until int64) acceptedConn {
	now := monotime()
	if now < until {
		if c := a.acceptQueued(); c != nil {
			return c
		}
		return a.awaitHandshakes(until)
	}
	if !a.s.queueOnlyShrinks() {
		return nil
	}
	if a.lateSince == 0 {
		a.lateSince = now
	}
	if now-a.lateSince >= int64(shrinkingQueueMax) {
		return nil
	}
	return a.acceptQueued()
}

// shrinkingQueueMax bounds how long a stopped loop goes on taking what is
// queued on a socket whose queue only shrinks once the drain's bound has
// passed (from the moment it finds it passed, which a look may have
// overrun by seconds): the queue holds at most its backlog, taken in
// milliseconds, so this is only ever reached where the refusal does not
// hold (new connections keep coming), and there it ends the loop.
const shrinkingQueueMax = queueDrainMax

// awaitHandshakes is a stopped loop's wait on a socket that closes for
// good (no successor accepts on it) once its queue is empty: a connection
// whose handshake is under way, or done on a TCP_DEFER_ACCEPT socket
// (listen.go) but with its first bytes still on their way, is not in the
// queue yet, and closing the socket now would reset it. So the socket
// stays open, accepting what completes, while the kernel still holds such
// a connection for its port (handshakesPending), never past until; nil
// once there is none. Where the steering program refuses new connections
// meanwhile, the wait ends as the handshakes do; without it new ones keep
// coming, and the wait is bounded by unrefusedGrace after accepting
// stopped instead (each look walks the kernel's table of connections).
// Not on a socket handed over to a successor, which accepts them itself:
// this generation would take new connections from it.
func (a *acceptor) awaitHandshakes(until int64) acceptedConn {
	if a.s.handedOver.Load() {
		return nil
	}
	if !a.s.refusing.Load() {
		until = min(until, until-int64(queueDrainMax)+int64(unrefusedGrace))
	}
	port := 0
	if ta, ok := a.s.ln.Addr().(*net.TCPAddr); ok {
		port = ta.Port
	}
	for {
		// Looked at before the queue: a connection no longer pending is
		// in the queue by then (or gone), and one that arrives after is
		// a new one, which the steering program refuses.
		looked := monotime()
		pending := handshakesPending(port, a.m.log)
		if c := a.acceptQueued(); c != nil {
			return c
		}
		now := monotime()
		if now >= until || !pending {
			return nil
		}
		// At least as long as the look took: on a host with very many
		// connections one look costs tens of milliseconds of CPU (the
		// kernel walks its whole table), and the wait in accept(2)
		// between looks delays no connection that completes.
		wait := max(handshakePoll, time.Duration(now-looked))
		a.s.setAcceptDeadline(time.Now().Add(min(time.Duration(until-now), wait)))
		c, err := a.acceptOne()
		if err == nil {
			return c
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			return nil
		}
	}
}

// handshakePoll is how often awaitHandshakes looks again.
const handshakePoll = 5 * time.Millisecond

// unrefusedGrace bounds awaitHandshakes where nothing refuses new
// connections: long enough for a client whose connect has returned to
// send its first bytes, which clients do at once.
const unrefusedGrace = 250 * time.Millisecond

// admit takes a connection slot for c and counts it, or closes c at once
// if a bound refuses it or the process is out of descriptors.
func (a *acceptor) admit(c acceptedConn) bool {
	if a.overloadClosesAccepted(c) {
		return false
	}
	if budget := a.m.budget; budget.spareMissing() {
		c.Close()
		budget.reopenSpare()
		a.st.cxOverflow.Inc()
		return false
	}
	if why := a.slots.take(); why != admitted {
		a.slots.refused(c, why, a.st)
		return false
	}
	a.st.accepted()
	return true
}

// acceptedConn is a connection as accept hands it out: a
// *rawsock.Conn from an HTTP listener, a *net.TCPConn from a TCP one.
type acceptedConn interface {
	net.Conn
	SetLinger(sec int) error
}

// acceptOne waits for the next connection on a's socket, within its
// deadline.
func (a *acceptor) acceptOne() (acceptedConn, error) {
	if a.raw != nil {
		c, err := a.raw.Accept()
		if err != nil {
			return nil, err // not a nil *rawsock.Conn in the interface
		}
		return c, nil
	}
	c, err := a.s.ln.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// acceptQueued takes a connection already queued on a's socket, without
// waiting and whatever its deadline (a stopped loop's has passed); nil
// when the queue is empty.
func (a *acceptor) acceptQueued() acceptedConn {
	if a.raw != nil {
		if c := a.raw.AcceptQueued(); c != nil {
			return c
		}
		return nil
	}
	if c := acceptQueued(a.s.ln); c != nil {
		return c
	}
	return nil
}

// acceptHTTP is an HTTP listener's accept loop for one worker: a goroutine
// per connection (one its worker parked, servepool.go, or a new one), each
// connection in its worker's connection set, so that a drain can tell idle
// connections from busy ones and close what is left at its deadline.
func (m *Manager) acceptHTTP(a *acceptor) {
	defer a.ml.acceptWG.Done()
	for {
		c, err := a.accept()
		if err != nil {
			return
		}
		// An HTTP listener's loops accept raw (a.raw): openListener ran
		// prepareHTTP, which gave each of its sockets a rawsock.Listener,
		// before any loop started.
		cc := m.newClientConn(a, c.(*rawsock.Conn))
		if !a.wk.conns.add(cc, a.ml) {
			cc.Close() // gives the slot back and counts the close
			continue
		}
		a.ml.httpWG.Add(1)
		m.serveHTTP(a.wk, cc)
		// Serve it before taking the next: a connection accepted here
		// has its request in already (TCP_DEFER_ACCEPT), and without
		// the yield the loop took every queued connection before any
		// was served, each one's request waiting out the whole batch's
		// accepts. Connection per request through one worker, the load
		// side then sat idle 4-7 % of the time, which it no longer does:
		// req/s +2.4 % (paired median; geometric mean +6.4 %) for CPU
		// per request +2.8 % (docs/benchmarks.md). The loop is back as
		// soon as what is runnable has run, or the scheduler's periodic
		// look at its global queue comes.
		runtime.Gosched()
	}
}

// acceptTCP is a TCP-proxy listener's accept loop for one worker.
func (m *Manager) acceptTCP(a *acceptor) {
	defer a.ml.acceptWG.Done()
	for {
		c, err := a.accept()
		if err != nil {
			return
		}
		tc := c.(*net.TCPConn)
		var clientTLS *tls.Conn
		if lt := a.ml.tls; lt != nil {
			clientTLS = tls.Server(tc, lt.config)
		}
		s := tcp.NewSession(tc, clientTLS)
		if !a.wk.conns.add(s, a.ml) {
			c.Close()
			a.st.closed()
			a.slots.release()
			continue
		}
		m.connWG.Add(1)
		go m.serveTCP(a.wk, a.ml, a.st, a.slots, s)
	}
}
