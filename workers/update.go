package workers

import (
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
)

// Listeners changed in process (dynamic configuration, issue 23): a
// listener added is bound (or adopted) and served; a removed one drains
// alone as a hot restart drains a generation; a changed one (same name,
// other settings) is served by a new instance at once, on the same
// sockets when its address is unchanged (nothing queued is lost, no bind
// race), while the old instance drains alone. Every other listener keeps
// its sockets, accept loops, steering and connections exactly as they
// were:
//
//	UpdateListeners ──▶ unchanged (sameFixed): kept; its TLS handshakes
//	                    use the caller's newer config (listenerTLS)
//	                ──▶ added, or changed: a new instance (new index)
//	                    adopting the sockets of its address from the
//	                    listeners that retire, or Unused ones
//	                ──▶ removed, or replaced: retiring; retire drains it
//	                    alone, then closes its sockets, program, logs
//
// One connection budget for all: a changed listener's instance shares
// the count of the one it replaces, so neither max_connections is ever
// exceeded while both have connections.

// UpdateOptions say how UpdateListeners builds and retires listeners. The
// zero value of each field is the default.
type UpdateOptions struct {
	// ServerTLS is the TLS server config of every listener of the
	// snapshot with [listeners.tls], as Options.ServerTLS. An unchanged
	// listener's new handshakes use its entry too (listenerTLS).
	ServerTLS map[string]*tls.Config
	// HTTPTimeout closes the HTTP connections (upgraded ones included)
	// of a removed or replaced listener still open this long after its
	// drain began (server.drain_time); 0: no bound but ShutdownTimeout.
	HTTPTimeout time.Duration
	// ShutdownTimeout closes whatever such a listener still has open
	// this long after its drain began, TCP-proxy sessions included
	// (server.parent_shutdown_time); 0: until Close.
	ShutdownTimeout time.Duration
}

// ListenerUpdate is what an UpdateListeners did, and the end of the
// drains it began.
type ListenerUpdate struct {
	// Added, Changed and Removed are listener names, in no order that
	// matters; Kept are the listeners left as they were.
	Added, Changed, Removed, Kept []string

	done chan struct{}
	mu   sync.Mutex // guards errs
	errs []error
}

// Done is closed once every listener the update removed or replaced has
// drained and closed what was its own.
func (u *ListenerUpdate) Done() <-chan struct{} { return u.done }

// Err is, once Done is closed, why a drain was cut short (connections
// closed at its deadline), or nil.
func (u *ListenerUpdate) Err() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return errors.Join(u.errs...)
}

// UpdateListeners makes snap's listeners the ones served, in place, and
// publishes snap. It is the main goroutine's, like Publish; it refuses a
// Manager that drains or is closed. On error nothing changed: every
// listener serves on as before and nothing of snap stays open.
func (m *Manager) UpdateListeners(snap *Snapshot, opts UpdateOptions) (*ListenerUpdate, error) {
	switch {
	case snap == nil:
		return nil, errors.New("workers: listeners not updated: nil snapshot")
	case snap.Workers() < m.n:
		return nil, fmt.Errorf("workers: listeners not updated: the snapshot has views for %d workers, the manager needs %d (build it with BuildSnapshotN)", snap.Workers(), m.n)
	case snap.reusePort != m.reusePort:
		return nil, fmt.Errorf("workers: listeners not updated: server.reuse_port changed (to %v); it takes a restart", snap.reusePort)
	}
	m.mu.Lock()
	stopped, current, retiring := m.stopped, m.listeners, m.retiring
	m.mu.Unlock()
	if stopped {
		return nil, errors.New("workers: listeners not updated: the workers are draining or closed")
	}

	u := &ListenerUpdate{done: make(chan struct{})}
	byName := make(map[string]*mlistener, len(current))
	for _, ml := range current {
		byName[ml.name] = ml
	}
	// What the snapshot keeps, and what it builds anew, in its order.
	var next, fresh, retire []*mlistener
	freshTLS := map[string]*listenerTLS{}
	for _, name := range snap.order {
		ls := snap.listeners[name]
		old := byName[name]
		if old != nil && sameFixed(old.spec, ls) {
			if old.tls != nil && opts.ServerTLS[name] == nil {
				return nil, fmt.Errorf("workers: listener %q: [listeners.tls] is set but no TLS server config was built for it (UpdateOptions.ServerTLS has no entry %q)", name, name)
			}
			next = append(next, old)
			u.Kept = append(u.Kept, name)
			continue
		}
		// TLS first: a listener without one fails before any socket
		// is touched.
		lt, err := newListenerTLS(ls, opts.ServerTLS)
		if err != nil {
			return nil, fmt.Errorf("workers: %w", err)
		}
		freshTLS[name] = lt
		next = append(next, nil) // filled in once opened
		if old != nil {
			u.Changed = append(u.Changed, name)
			retire = append(retire, old)
		} else {
			u.Added = append(u.Added, name)
		}
	}
	for _, ml := range current {
		if _, ok := snap.listeners[ml.name]; !ok {
			u.Removed = append(u.Removed, ml.name)
			retire = append(retire, ml)
		}
	}

	// The sockets a new instance may adopt, by key: those of its address
	// of the listeners that retire now or still drain from an earlier
	// update (dups: the retiring instance keeps its own until its drain
	// ends), and the inherited ones no listener took (Unused).
	olds := append(slices.Clip(retire), retiring...)
	adopted := map[string]bool{} // by address: a new instance took sockets there
	for i, name := range snap.order {
		if next[i] != nil {
			continue
		}
		ls := snap.listeners[name]
		pool, fromUnused := m.adoptable(ls, olds)
		before := len(pool)
		ml, err := m.openListener(ls, freshTLS[name], snap.id.Epoch, pool)
		if len(pool) < before {
			adopted[ls.address] = true
		}
		m.giveBack(pool, fromUnused)
		if err != nil {
			for _, ml := range fresh {
				ml.closeUnstarted()
			}
			return nil, err
		}
		next[i] = ml
		fresh = append(fresh, ml)
	}

	// A socket can be in one program's array only: a retiring instance
	// whose sockets a new one took lets go of them first (as Sockets
	// does for a next generation).
	for _, ml := range olds {
		if ml.steer != nil && adopted[ml.addr] {
			if err := ml.steer.Release(); err != nil {
				m.log.Warn("listener balance: cannot hand the sockets' steering over to the listener's new settings; it falls back to the kernel's flow hash",
					"listener", ml.name, "error", err)
			}
		}
	}
	for _, ml := range fresh {
		attachSteering(ml, m.n, adopted[ml.addr])
		logSteering(m.log, ml, m.queueEmptying)
	}
	// One bound per name: a new instance counts in the count of the
	// instance it replaces, or of one of that name still draining.
	for _, ml := range fresh {
		var open *paddedCount
		for _, old := range olds {
			if old.name == ml.name {
				open = old.slots.open
				break
			}
		}
		m.joinListener(ml, open)
	}
	for _, ml := range next {
		if ml.tls != nil && !slices.Contains(fresh, ml) {
			ml.tls.current.Store(opts.ServerTLS[ml.name])
		}
	}

	m.mu.Lock()
	if m.stopped {
		// A drain began meanwhile (it is not the main goroutine's
		// alone): nothing of the update serves.
		m.mu.Unlock()
		for _, ml := range fresh {
			ml.closeUnstarted()
			if !slices.ContainsFunc(olds, func(o *mlistener) bool { return o.slots.open == ml.slots.open }) {
				m.budget.leave(ml.slots.open)
			}
		}
		return nil, errors.New("workers: listeners not updated: the workers began to drain")
	}
	m.listeners = next
	m.retiring = append(m.retiring, retire...)
	// What a listener that serves now accepts on is handed over: the
	// drain of a retiring instance on the same socket leaves what is
	// queued there to it.
	serving := map[SocketKey]bool{}
	for _, ml := range next {
		for _, s := range ml.sockets {
			serving[s.key] = true
		}
	}
	for _, ml := range m.retiring {
		for _, s := range ml.sockets {
			s.handedOver.Store(serving[s.key])
		}
	}
	overload := m.overload
	m.mu.Unlock()

	m.Publish(snap)
	if overload != nil {
		m.SetOverload(*overload) // the new listeners' shrunk settings and programs
	}
	// A replaced instance whose sockets its successor took stops
	// accepting before the successor starts, so that every connection
	// from now on gets the new settings: nothing is lost meanwhile (the
	// queue is the same), nothing is emptied (it is the successor's).
	var handed []*mlistener
	for _, ml := range retire {
		if ml.allHandedOver() {
			handed = append(handed, ml)
		}
	}
	m.stopListeners(handed, false)
	m.mu.Lock()
	if m.started && !m.stopped {
		for _, ml := range fresh {
			m.startListenerLocked(ml)
		}
	}
	m.mu.Unlock()

	var drains sync.WaitGroup
	for _, ml := range retire {
		drains.Add(1)
		m.retireWG.Add(1)
		go func() {
			defer m.retireWG.Done()
			defer drains.Done()
			if err := m.retire(ml, opts); err != nil {
				u.mu.Lock()
				u.errs = append(u.errs, err)
				u.mu.Unlock()
			}
		}()
	}
	go func() {
		drains.Wait()
		close(u.done)
	}()
	m.log.Info("listeners updated in place", "added", strings.Join(u.Added, ","), "changed", strings.Join(u.Changed, ","),
		"removed", strings.Join(u.Removed, ","), "kept", len(u.Kept))
	return u, nil
}

// retire drains listener ml alone, as a hot restart drains a generation:
// it stops accepting (emptying the queues of the sockets no listener
// serves on any more), its HTTP/1.1 responses carry "Connection: close"
// and its idle keep-alive connections close after drainIdleGrace, its
// HTTP/2 connections get GOAWAY; its HTTP connections are closed at
// HTTPTimeout, everything else at ShutdownTimeout (or when the Manager is
// closed). Then its steering program and access logs close, and it
// leaves the Manager and the budget. The error says what was cut short.
func (m *Manager) retire(ml *mlistener, opts UpdateOptions) error {
	ml.draining.Store(true)
	m.http.GoAwayHTTP2Of(&ml.draining)
	m.stopListeners([]*mlistener{ml}, m.queueEmptying && !ml.allHandedOver())

	cut, cause := m.closeAsTheyFinish(ml, opts.HTTPTimeout, opts.ShutdownTimeout)
	if cut > 0 && cause == nil {
		cause = errClosed // forced: the Manager closes
	}
	// Its connections' goroutines record their last requests before the
	// access logs close.
	waitAtMost(&ml.httpWG, closeWaitForHTTP)
	closeErr := ml.closeResources()
	m.closeIdleUpstreams(ml)

	m.mu.Lock()
	m.retiring = slices.DeleteFunc(slices.Clone(m.retiring), func(o *mlistener) bool { return o == ml })
	m.beats = slices.DeleteFunc(slices.Clone(m.beats), func(b loopBeat) bool { return b.ml == ml })
	shared := false
	for _, o := range append(slices.Clip(m.listeners), m.retiring...) {
		shared = shared || o.slots.open == ml.slots.open
	}
	m.mu.Unlock()
	if !shared {
		m.budget.leave(ml.slots.open)
	}

	var err error
	if cut > 0 {
		err = fmt.Errorf("workers: listener %q: drain cut short: %d connections closed: %w", ml.name, cut, cause)
	}
	m.log.Debug("listener drained", "listener", ml.name, "closed_at_deadline", cut)
	return errors.Join(err, closeErr)
}

// closeIdleUpstreams closes the idle pooled upstream connections that
// retired listener ml's connections left in the clusters it routed to and
// that the published snapshot no longer has (Publish closed the idle ones
// when it replaced them; its drain may have pooled more since). The
// clusters the snapshot has keep their pools.
func (m *Manager) closeIdleUpstreams(ml *mlistener) {
	m.mu.Lock()
	cur := m.snap
	m.mu.Unlock()
	for w, wk := range m.workers {
		lv := wk.view.Load().listener(ml.idx)
		if lv == nil || cur == nil {
			continue
		}
		var wcs []*upstream.WorkerCluster
		if lv.http != nil {
			wcs = append(wcs, lv.http.Clusters...)
		}
		if lv.tcp != nil {
			wcs = append(append(wcs, lv.tcp.Cluster), lv.tcp.SNIClusters...)
		}
		for _, wc := range wcs {
			if wc != nil && !slices.Contains(slices.Collect(maps.Values(cur.views[w])), wc) {
				wc.CloseIdle()
			}
		}
	}
}

// allHandedOver reports whether a listener that serves now accepts on
// every socket of ml (UpdateListeners set handedOver).
func (ml *mlistener) allHandedOver() bool {
	for _, s := range ml.sockets {
		if !s.handedOver.Load() {
			return false
		}
	}
	return len(ml.sockets) > 0
}

// adoptable returns the sockets a new instance of ls may adopt (dups of
// those of the retiring listeners olds at its address, and the Unused
// inherited ones there, taken out of m.unused: fromUnused says which). A
// port-0 address names no port: there only a retiring instance of the
// same name is the same socket.
func (m *Manager) adoptable(ls *listenerSnap, olds []*mlistener) (pool map[SocketKey]*os.File, fromUnused map[SocketKey]bool) {
	pool, fromUnused = map[SocketKey]*os.File{}, map[SocketKey]bool{}
	_, port, _ := net.SplitHostPort(ls.address)
	for _, ml := range olds {
		if ml.addr != ls.address || (port == "0" && ml.name != ls.name) {
			continue
		}
		for _, s := range ml.sockets {
			if _, dup := pool[s.key]; dup {
				continue
			}
			if f, err := s.ln.File(); err == nil {
				pool[s.key] = f
			} // closed already: its drain is over, so a fresh bind it is
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, f := range m.unused {
		if _, dup := pool[k]; !dup && k.Network == "tcp" && k.Address == ls.address && port != "0" {
			pool[k], fromUnused[k] = f, true
			delete(m.unused, k)
		}
	}
	return pool, fromUnused
}

// giveBack returns what no new instance took of pool: the dups closed,
// the Unused ones back in m.unused.
func (m *Manager) giveBack(pool map[SocketKey]*os.File, fromUnused map[SocketKey]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, f := range pool {
		if !fromUnused[k] {
			f.Close()
			continue
		}
		if m.unused == nil {
			m.unused = map[SocketKey]*os.File{}
		}
		m.unused[k] = f
	}
}
