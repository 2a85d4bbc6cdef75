package workers

import (
	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/downstream/tcp"
	"github.com/hotproxy/hotproxy/upstream"
)

// Publish hands a new snapshot to every worker (RCU): new connections and
// requests use it, those in flight keep theirs. The previous snapshot's
// idle upstream connections are closed. A snapshot built for fewer
// workers than the Manager has is refused (logged).
//
// Listener sockets and the HTTP connection settings (header, idle and
// write timeouts, header size) are fixed by New and UpdateListeners (which
// publishes itself); a listener missing from snap, or with another
// protocol, answers 404 (http) or closes connections (tcp) until a
// snapshot has it again.
func (m *Manager) Publish(snap *Snapshot) {
	if snap == nil {
		return
	}
	if snap.Workers() < m.n {
		m.log.Error("snapshot refused: built for fewer workers", "snapshot_workers", snap.Workers(), "workers", m.n)
		return
	}
	for _, c := range snap.clusters {
		c.SetMembership(m.stats)
	}
	for w, wk := range m.workers {
		for name, wc := range snap.views[w] {
			if wc.Stats() == nil {
				wc.BindStats(upstream.NewStats(m.stats, name, w+1))
			}
		}
		wk.view.Store(m.buildView(snap, w))
	}
	m.mu.Lock()
	old := m.snap
	m.snap = snap
	m.mu.Unlock()
	if old != nil && old != snap {
		old.closeIdleExcept(snap)
	}
}

func (m *Manager) buildView(snap *Snapshot, w int) *workerView {
	m.mu.Lock()
	current, retiring, slots := m.listeners, m.retiring, m.nextIdx
	m.mu.Unlock()
	v := &workerView{snap: snap, listeners: make([]*listenerView, slots)}
	// A listener that drains after UpdateListeners removed or replaced
	// it keeps the routing it had: its connections finish as they
	// started (they are told to close, never answered 404).
	if prev := m.workers[w].view.Load(); prev != nil {
		for _, ml := range retiring {
			v.listeners[ml.idx] = prev.listener(ml.idx)
		}
	}
	for _, ml := range current {
		ls := snap.listeners[ml.name]
		if ls == nil || ls.protocol != ml.protocol {
			if w == 0 {
				m.log.Warn("listener not in the published snapshot; it serves nothing", "listener", ml.name)
			}
			continue
		}
		lv := &listenerView{listenerSnap: ls}
		if ls.protocol != config.ProtocolHTTP {
			lv.tcp = &tcp.Listener{Name: ls.name, HashOn: ls.tcpHashOn, SNIRoutes: ls.sniRoutes,
				HelloTimeout: ls.helloTimeout, IdleTimeout: ls.idleTimeout}
			if ls.cluster != "" {
				lv.tcp.Cluster = snap.views[w][ls.cluster]
			}
			for _, r := range ls.sniRoutes {
				lv.tcp.SNIClusters = append(lv.tcp.SNIClusters, snap.views[w][r.Cluster])
			}
		}
		if ls.protocol == config.ProtocolHTTP {
			lv.http = &httpfront.View{Routes: ls.routes, H2Upstreams: snap.h2Upstreams}
		}
		if lv.http != nil && len(ls.targets) > 0 {
			lv.http.Clusters = make([]*upstream.WorkerCluster, len(ls.targets))
			for j, r := range ls.targets {
				if r.Cluster != "" {
					lv.http.Clusters[j] = snap.views[w][r.Cluster]
				}
			}
		}
		v.listeners[ml.idx] = lv
	}
	return v
}

// listener is the view of the listener with index i; nil: not in the
// snapshot (a retired listener's connections get nil once the view that
// replaced them is published).
func (v *workerView) listener(i int) *listenerView {
	if i >= len(v.listeners) {
		return nil
	}
	return v.listeners[i]
}

// closeIdle closes the idle pooled upstream connections of every worker.
func (s *Snapshot) closeIdle() { s.closeIdleExcept(nil) }

// closeIdleExcept closes the idle pooled upstream connections of every
// worker's view that keep (the snapshot replacing s) does not carry over:
// a carried cluster's pool is the new snapshot's own.
func (s *Snapshot) closeIdleExcept(keep *Snapshot) {
	for w, v := range s.views {
		for name, wc := range v {
			if keep != nil && w < len(keep.views) && keep.views[w][name] == wc {
				continue
			}
			wc.CloseIdle()
		}
	}
}
