package workers

import (
	"errors"
	"net"
	"time"
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
	s  *socket
	wk *worker
	li int // the listener's index
	st *listenerStats
}

// accept returns the next connection. A transient error is logged and
// retried after a back-off. Once accepting stops in a drain, it hands out
// what is still queued on the socket (a closed listening socket resets its
// queue), then closes the socket and reports net.ErrClosed.
func (a *acceptor) accept() (*net.TCPConn, error) {
	var delay time.Duration
	for {
		c, err := a.s.ln.AcceptTCP()
		if err == nil {
			a.st.accepted()
			return c, nil
		}
		if a.m.acceptStopped() {
			until := a.m.emptyQueuesUntil.Load()
			if until == 0 {
				return nil, net.ErrClosed
			}
			if monotime() < until {
				if c := acceptQueued(a.s.ln); c != nil {
					a.st.accepted()
					return c, nil
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
		delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
		a.m.log.Warn("accept failed; retrying", "address", a.s.key.Address, "worker", a.wk.id, "retry_in", delay, "error", err)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-a.m.stopAccept:
			t.Stop()
		}
	}
}

// acceptHTTP is an HTTP listener's accept loop for one worker: a goroutine
// per connection, each in its worker's connection set, so that a drain can
// tell idle connections from busy ones and close what is left at its
// deadline.
func (m *Manager) acceptHTTP(a *acceptor) {
	defer m.acceptWG.Done()
	for {
		c, err := a.accept()
		if err != nil {
			return
		}
		cc := m.newClientConn(a, c)
		if !a.wk.conns.add(cc) {
			c.Close()
			a.st.closed()
			continue
		}
		go cc.serve()
	}
}

// acceptTCP is a TCP-proxy listener's accept loop for one worker.
func (m *Manager) acceptTCP(a *acceptor, li int) {
	defer m.acceptWG.Done()
	for {
		c, err := a.accept()
		if err != nil {
			return
		}
		s := &tcpSession{client: c}
		if !a.wk.conns.add(s) {
			c.Close()
			a.st.closed()
			continue
		}
		m.connWG.Add(1)
		go m.serveTCP(a.wk, li, a.st, s)
	}
}
