package workers

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Accept back-off after a transient error (EMFILE, ENFILE, ECONNABORTED,
// ENOBUFS...): doubling from the first to the last, never giving up.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptor is one worker's accept loop on one socket. As a net.Listener it
// is what that worker's http.Server serves on.
type acceptor struct {
	m    *Manager
	s    *socket
	wk   *worker
	st   *listenerStats
	http bool
	// slots bounds the listener's open connections (connlimit.go): every
	// connection accept returns holds one, which its close gives back.
	slots *connSlots
}

var _ net.Listener = (*acceptor)(nil)

// accept returns the next connection, holding a connection slot that the
// connection's close must give back (connSlots.release). A connection over
// a max_connections bound is closed at once and counted, and the loop goes
// on. A transient error is logged (throttled) and retried after a
// back-off; out of descriptors, queued connections are first shed with the
// spare one (connBudget.shedOne). Once accepting stops in a drain, it
// hands out what is still queued on the socket (a closed listening socket
// resets its queue), then closes the socket and reports net.ErrClosed.
func (a *acceptor) accept() (*net.TCPConn, error) {
	var delay time.Duration
	for {
		c, err := a.s.ln.AcceptTCP()
		if err == nil {
			if a.admit(c) {
				return c, nil
			}
			continue
		}
		if a.m.acceptStopped() {
			until := a.m.emptyQueuesUntil.Load()
			if until == 0 {
				return nil, net.ErrClosed
			}
			if monotime() < until {
				if c := acceptQueued(a.s.ln); c != nil {
					if a.admit(c) {
						return c, nil
					}
					continue
				}
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
		case <-a.m.stopAccept:
			t.Stop()
		}
	}
}

// admit takes a connection slot for c and counts it, or closes c at once
// if a bound refuses it or the process is out of descriptors.
func (a *acceptor) admit(c *net.TCPConn) bool {
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

// Accept implements net.Listener for http.Server. Every HTTP connection is
// in its worker's connection set, so a drain can tell idle ones from busy
// ones and close what is left at its deadline.
func (a *acceptor) Accept() (net.Conn, error) {
	for {
		c, err := a.accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, st: a.st, set: &a.wk.conns, slots: a.slots}
		if a.wk.conns.add(tc) {
			return tc, nil
		}
		tc.Close()
	}
}

// Close does not close the socket: http.Server closes its listener when
// Serve returns, and whether the socket may close (and when) is the
// Manager's decision, not the server's.
func (a *acceptor) Close() error { return nil }

func (a *acceptor) Addr() net.Addr { return a.s.ln.Addr() }

// trackedConn is an HTTP client connection: it counts bytes, its end, and
// knows whether it is idle between requests (for the drain).
// It embeds the net.Conn interface, not *net.TCPConn, so that ReadFrom
// and WriteTo cannot bypass the counting.
type trackedConn struct {
	net.Conn
	st     *listenerStats
	set    *connSet
	slots  *connSlots // the slot accept took; Close gives it back
	closed atomic.Bool
	// idleSince is when the connection last became idle between requests
	// (monotime), or 0 while it is new, active or hijacked.
	idleSince atomic.Int64
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.st.rxBytes.Add(uint64(n))
	}
	return n, err
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.st.txBytes.Add(uint64(n))
	}
	return n, err
}

// CloseWrite lets net/http half-close after an early answer (400, 431) and
// wait for the client to finish sending, so the client reads the answer
// instead of a reset.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *trackedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.st.closed()
		c.set.remove(c)
		c.slots.release() // connection slot (connlimit.go): once, here
	}
	return c.Conn.Close()
}

// setState is the http.Server ConnState hook's view of c.
func (c *trackedConn) setState(st http.ConnState) {
	if st == http.StateIdle {
		c.idleSince.Store(max(monotime(), 1))
	} else {
		c.idleSince.Store(0)
	}
}

// idleFor reports how long c has been idle between requests, or 0.
func (c *trackedConn) idleFor(now int64) time.Duration {
	since := c.idleSince.Load()
	if since == 0 {
		return 0
	}
	return time.Duration(now - since)
}

// acceptTCP is a TCP-proxy listener's accept loop for one worker.
func (m *Manager) acceptTCP(a *acceptor, li int) {
	defer m.acceptWG.Done()
	for {
		c, err := a.accept()
		if err != nil {
			return
		}
		s := &tcpSession{client: c, slots: a.slots}
		if !a.wk.conns.add(s) {
			c.Close()
			a.st.closed()
			a.slots.release()
			continue
		}
		m.connWG.Add(1)
		go m.serveTCP(a.wk, li, a.st, s)
	}
}
