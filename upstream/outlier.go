package upstream

import "time"

// MaxEjectionMultiplier caps how much an endpoint's ejection grows: the
// n-th ejection lasts base_ejection_time × min(n, MaxEjectionMultiplier),
// so a flapping endpoint is kept out longer, but never for ever.
const MaxEjectionMultiplier = 10

// ejectOutliers ejects every endpoint whose reported failures in a row
// reached a threshold, unless max_ejection_percent of the endpoints are
// ejected already (Envoy's rule: the check is made before each ejection).
// It reports whether anything changed.
func (m *Monitor) ejectOutliers(now time.Time) bool {
	st, od := m.c.state, m.od
	if od == nil {
		return false
	}
	n := len(m.ejected)
	changed := false
	for i := range n {
		h := &st.shared[i]
		hit := (st.consecutive5xx > 0 && h.consecutive5xx.Load() >= st.consecutive5xx) ||
			(st.consecutiveConnectFail > 0 && h.consecutiveConnectFail.Load() >= st.consecutiveConnectFail)
		if m.ejected[i] || !hit {
			continue
		}
		// Counted from zero again, whatever is decided.
		h.consecutive5xx.Store(0)
		h.consecutiveConnectFail.Store(0)
		if m.ejectedCount()*100 >= orZero(od.MaxEjectionPercent)*n {
			if m.st != nil {
				m.st.ejectionsOverflow.Inc()
			}
			m.log.Warn("endpoint not ejected: max_ejection_percent reached", "endpoint", m.addrs[i], "max_ejection_percent", od.MaxEjectionPercent)
			continue
		}
		m.ejections[i]++
		d := od.BaseEjectionTime.D() * time.Duration(min(m.ejections[i], MaxEjectionMultiplier))
		m.ejected[i], m.until[i] = true, now.Add(d)
		changed = true
		if m.st != nil {
			m.st.ejectionsTotal.Inc()
		}
		m.log.Warn("endpoint ejected", "endpoint", m.addrs[i], "for", d, "ejections", m.ejections[i])
	}
	return changed
}

func (m *Monitor) ejectedCount() int {
	k := 0
	for _, e := range m.ejected {
		if e {
			k++
		}
	}
	return k
}

// unejectDue returns the endpoints whose ejection time is over.
func (m *Monitor) unejectDue(now time.Time) bool {
	changed := false
	for i, e := range m.ejected {
		if e && !now.Before(m.until[i]) {
			m.ejected[i] = false
			h := &m.c.state.shared[i]
			h.consecutive5xx.Store(0)
			h.consecutiveConnectFail.Store(0)
			changed = true
			m.log.Info("endpoint returned from ejection", "endpoint", m.addrs[i])
		}
	}
	return changed
}

func (m *Monitor) nextUneject() (time.Time, bool) {
	var next time.Time
	ok := false
	for i, e := range m.ejected {
		if e && (!ok || m.until[i].Before(next)) {
			next, ok = m.until[i], true
		}
	}
	return next, ok
}
