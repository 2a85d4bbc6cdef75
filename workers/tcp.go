package workers

import (
	"github.com/hotproxy/hotproxy/downstream/tcp"
)

// serveTCP runs one accepted connection of a tcp listener through the TCP
// front end (downstream/tcp), after the TLS handshake when the listener
// terminates TLS, and gives back what accept took: its place in the
// connection set and its connection slot (connlimit.go, once, here).
func (m *Manager) serveTCP(wk *worker, ml *mlistener, st *listenerStats, slots *connSlots, s *tcp.Session) {
	defer m.connWG.Done()
	defer func() {
		s.Close()
		wk.conns.remove(s)
		st.closed()
		slots.release()
	}()
	lv := wk.view.Load().listener(ml.idx)
	if lv == nil || lv.tcp == nil {
		return
	}
	if tc := s.ClientTLS(); tc != nil {
		if _, err := ml.tls.handshake(tc, s.Client(), st.tls); err != nil {
			if m.log.IsDebug() {
				m.log.Debug("TLS handshake failed", "listener", lv.name, "client", s.Client().RemoteAddr(), "error", err)
			}
			return
		}
	}
	s.Serve(tcp.Env{Ctx: m.ctx, Log: m.log, Worker: wk.id}, lv.tcp,
		tcp.Counters{RxBytes: st.RxBytes, TxBytes: st.TxBytes, SNINoRoute: st.sniNoRoute})
}
