package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
)

// acceptStopped reports whether ml's accepting has stopped.
func (ml *mlistener) acceptStopped() bool {
	select {
	case <-ml.stopAccept:
		return true
	default:
		return false
	}
}

// acceptStopped reports whether the whole Manager stopped accepting.
func (m *Manager) acceptStopped() bool {
	select {
	case <-m.stopAccept:
		return true
	default:
		return false
	}
}

// stopAccepting stops every accept loop of every listener (those still
// draining after UpdateListeners included) and then closes this
// generation's descriptors of the listening sockets, once
// (stopListeners).
func (m *Manager) stopAccepting(emptyQueues bool) {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.stopped = true
	close(m.stopAccept)
	all := append(slices.Clip(m.listeners), m.retiring...)
	m.mu.Unlock()
	m.stopListeners(all, emptyQueues)
}

// stopListeners stops the accept loops of ls (each once; a listener
// stopped already keeps how it was stopped) and then closes their
// descriptors of the listening sockets. With emptyQueues, each accept loop
// first takes what is still queued on its socket (for at most
// queueDrainMax; where the steering program refuses new connections to a
// socket that closes for good, what is queued when that time is up too:
// acceptor.takeQueued): a socket that no successor holds — the last
// generation, or a listener the successor dropped — resets its queue when
// it closes.
// Where a successor holds the socket it accepts from the same queue, and
// whatever this generation leaves is the successor's.
func (m *Manager) stopListeners(ls []*mlistener, emptyQueues bool) {
	var stopping []*mlistener
	m.mu.Lock()
	for _, ml := range ls {
		if ml.stopped {
			continue
		}
		ml.stopped = true
		if emptyQueues {
			ml.emptyQueuesUntil.Store(monotime() + int64(queueDrainMax))
			// Where this generation's program still steers a group
			// (it stops for good, or a successor dropped the
			// listener), nothing new may enter the queues being
			// emptied.
			if ml.steer != nil {
				ml.steer.RefuseNew()
				for _, s := range ml.sockets {
					s.refusing.Store(true)
				}
			}
		}
		close(ml.stopAccept)
		stopping = append(stopping, ml)
	}
	m.mu.Unlock()
	// A deadline in the past wakes every accept loop without touching
	// the socket itself.
	now := time.Now()
	for _, ml := range stopping {
		for _, s := range ml.sockets {
			s.setAcceptDeadline(now)
		}
	}
	for _, ml := range ls {
		ml.acceptWG.Wait()
	}
	for _, ml := range ls {
		for _, s := range ml.sockets {
			s.close()
		}
	}
}

// forceDrain makes a running or future drain close whatever is left.
func (m *Manager) forceDrain(cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forceErr != nil {
		return
	}
	m.forceErr = cause
	close(m.force)
	m.cancel()
}

// queueDrainMax bounds how long a stopped accept loop keeps taking queued
// connections, so that a generation racing its successor on a busy shared
// queue stops at some point.
const queueDrainMax = time.Second

// DrainOptions say how a generation drains. The zero value is the default.
type DrainOptions struct {
	// HTTPTimeout closes HTTP connections (upgraded ones included) still
	// open this long after the drain began; zero leaves them to ctx.
	// TCP-proxy connections run until ctx ends.
	HTTPTimeout time.Duration
	// HandedOver are the sockets a successor has taken over and accepts
	// on (the same sockets, not copies): what is queued or on its way in
	// them is the successor's. A socket not in it closes for good with
	// this drain, and is kept open after its queue is empty while the
	// kernel still holds connections to it mid-handshake (or, deferring
	// accept, waiting for their first bytes): acceptor.awaitHandshakes.
	// nil: none, as at a last shutdown.
	HandedOver map[SocketKey]bool
}

// drainIdleGrace: during a drain, a keep-alive connection idle this long
// is closed. Its client is not sending; a client that is sending gets
// "Connection: close" on its next response instead, and so never has a
// connection closed under a request it is about to send.
const drainIdleGrace = time.Second

// drainPoll is how often a drain looks at what is left.
const drainPoll = 20 * time.Millisecond

// Drain stops accepting on every listener, makes HTTP responses carry
// "Connection: close", closes keep-alive connections once idle for
// drainIdleGrace, and waits for in-flight HTTP requests and TCP
// connections to finish. Connections already accepted by the kernel are
// served, never reset. When ctx ends, whatever is left is closed. Drain is
// idempotent and safe to call concurrently: every call waits for the one
// drain (the first call's options apply); the first ctx to end forces it.
// It returns nil when everything finished by itself.
func (m *Manager) Drain(ctx context.Context, opts DrainOptions) error {
	m.drainOnce.Do(func() { go m.drain(opts) })
	select {
	case <-m.drainDone:
	case <-ctx.Done():
		m.forceDrain(context.Cause(ctx))
		<-m.drainDone
	}
	return m.drainErr
}

func (m *Manager) drain(opts DrainOptions) {
	defer close(m.drainDone)
	m.draining.Store(true)
	all := m.allListeners()
	for _, ml := range all {
		ml.draining.Store(true)
	}
	m.http.GoAwayHTTP2() // HTTP/2's "Connection: close" (downstream/http)
	for _, ml := range all {
		for _, s := range ml.sockets {
			s.handedOver.Store(opts.HandedOver[s.key])
		}
	}
	m.stopAccepting(m.queueEmptying)

	cut, cause := m.closeAsTheyFinish(nil, opts.HTTPTimeout, 0)
	m.connWG.Wait()
	m.mu.Lock()
	snap, forced := m.snap, m.forceErr
	m.mu.Unlock()
	if snap != nil {
		snap.closeIdle()
	}
	if cut > 0 {
		if forced != nil {
			cause = forced // what ended the drain, not the deadline before it
		}
		m.drainErr = fmt.Errorf("workers: drain cut short: %d connections closed: %w", cut, cause)
	}
	m.log.Debug("drained", "closed_at_deadline", cut)
}

// closeAsTheyFinish waits until the connections of only (nil: of every
// listener) have finished, closing each keep-alive connection once idle
// for drainIdleGrace, the HTTP ones still open httpTimeout after it began
// and all of them shutdownTimeout after (0: no such bound), and all at
// once when the drain is forced (the connection sets refuse new ones
// then, where only is nil). It returns how many it closed and why, nil
// when forcing did.
func (m *Manager) closeAsTheyFinish(only *mlistener, httpTimeout, shutdownTimeout time.Duration) (cut int, cause error) {
	var httpDeadline, shutdown <-chan time.Time
	if httpTimeout > 0 {
		t := time.NewTimer(httpTimeout)
		defer t.Stop()
		httpDeadline = t.C
	}
	if shutdownTimeout > 0 {
		t := time.NewTimer(shutdownTimeout)
		defer t.Stop()
		shutdown = t.C
	}
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	closeAll := func() {
		for _, wk := range m.workers {
			if only == nil {
				cut += wk.conns.killAll()
			} else {
				cut += wk.conns.closeListener(only)
			}
		}
	}
	for {
		left, now := 0, monotime()
		for _, wk := range m.workers {
			left += wk.conns.closeIdle(now, drainIdleGrace, only)
		}
		if left == 0 {
			return cut, cause
		}
		select {
		case <-tick.C:
		case <-httpDeadline:
			httpDeadline = nil
			for _, wk := range m.workers {
				cut += wk.conns.closeHTTP(only)
			}
			cause = fmt.Errorf("HTTP connections still open %v after the drain began", httpTimeout)
		case <-shutdown:
			closeAll()
			return cut, fmt.Errorf("connections still open %v after the drain began", shutdownTimeout)
		case <-m.force:
			closeAll()
			return cut, nil
		}
	}
}

var errClosed = errors.New("workers: manager closed")

// Close closes every socket and connection at once, those of listeners
// still draining after UpdateListeners included.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.forceDrain(errClosed)
		// A retiring listener may be emptying its queue for up to
		// queueDrainMax: at Close its sockets close now, which ends
		// that (stopAccepting waits for its accept loops).
		m.mu.Lock()
		retiring := m.retiring
		m.mu.Unlock()
		for _, ml := range retiring {
			for _, s := range ml.sockets {
				s.close()
			}
		}
		m.stopAccepting(false)
		all := m.allListeners()
		var errs []error
		for _, ml := range all {
			for _, s := range ml.sockets {
				if err := s.close(); err != nil && !errors.Is(err, net.ErrClosed) {
					errs = append(errs, fmt.Errorf("listener %q: %w", ml.name, err))
				}
			}
		}
		for _, wk := range m.workers {
			wk.conns.killAll()
		}
		for _, ml := range all {
			ml.acceptWG.Wait()
		}
		m.budget.close() // no accept loop uses the spare any more
		m.connWG.Wait()
		// The forced drains of retiring listeners end now (their
		// connections are closed); each closes what is its own.
		m.retireWG.Wait()
		m.mu.Lock()
		unused, snap := m.unused, m.snap
		m.unused = nil
		m.mu.Unlock()
		for _, f := range unused {
			if f != nil {
				f.Close()
			}
		}
		if snap != nil {
			snap.closeIdle()
		}
		m.mu.Lock()
		started := m.started
		m.mu.Unlock()
		close(m.stopMigrations)
		if started {
			<-m.migrationsDone
			<-m.reclaimDone
		}
		// The HTTP connections' sockets are closed (killAll), so each
		// goroutine ends at its next read or write and records the
		// request it was finishing; wait for that, so that the log of a
		// response already sent is not closed under it. One waiting on
		// an upstream learns of the close only from the upstream, hence
		// the bound. Last: the queued lines of every request served
		// are written (closeResources).
		deadline := time.Now().Add(closeWaitForHTTP)
		for _, ml := range all {
			waitAtMost(&ml.httpWG, time.Until(deadline))
			errs = append(errs, ml.closeResources())
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// closeResources closes the listener's steering program and, after its
// last request, its access logs; once (a retiring listener's drain and the
// Manager's Close may both get here).
func (ml *mlistener) closeResources() error {
	ml.closeOnce.Do(func() {
		var errs []error
		if ml.steer != nil {
			errs = append(errs, ml.steer.Close())
		}
		for _, al := range ml.accessLogs {
			errs = append(errs, al.Close())
		}
		ml.closeErr = errors.Join(errs...)
	})
	return ml.closeErr
}

// closeWaitForHTTP bounds how long Close waits for HTTP connections'
// goroutines to finish after their sockets were closed.
const closeWaitForHTTP = 2 * time.Second

// waitAtMost waits for wg, or for d, whichever comes first.
func waitAtMost(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
