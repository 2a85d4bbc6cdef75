package upstream

// resolution is one host name's new address, or why it has none.
type resolution struct {
	endpoint int
	addr     string
	err      error
}

// resolvesNames reports whether the cluster has endpoints given by host
// name to resolve again every dns_refresh.
func (c *Cluster) resolvesNames() bool {
	if c.dnsRefresh <= 0 {
		return false
	}
	for _, n := range c.names {
		if n != "" {
			return true
		}
	}
	return false
}

// resolveNames resolves every endpoint given by name (each bounded by
// ResolveTimeout), keeping an address of current when it is still among
// the answers. It runs off the monitor's goroutine.
func (c *Cluster) resolveNames(current []string) []resolution {
	var out []resolution
	for i, name := range c.names {
		if name == "" {
			continue
		}
		addr, err := resolveEndpoint(name, current[i])
		out = append(out, resolution{endpoint: i, addr: addr, err: err})
	}
	return out
}

// applyResolutions moves endpoints whose name resolves elsewhere now; a
// name that does not resolve keeps its last good address. It reports
// whether an address changed. An endpoint at a new address must pass a
// health check (when there are checks) before it takes traffic again.
func (m *Monitor) applyResolutions(res []resolution) bool {
	changed := false
	for _, r := range res {
		if m.st != nil {
			m.st.updateAttempt.Inc()
		}
		if r.err != nil {
			if m.st != nil {
				m.st.updateFailure.Inc()
			}
			m.log.Warn("endpoint name no longer resolves: keeping its last address", "endpoint", m.c.names[r.endpoint], "address", m.addrs[r.endpoint], "error", r.err)
			continue
		}
		if m.st != nil {
			m.st.updateSuccess.Inc()
		}
		i := r.endpoint
		if r.addr == m.addrs[i] {
			continue
		}
		m.log.Info("endpoint name resolves to a new address", "endpoint", m.c.names[i], "from", m.addrs[i], "to", r.addr)
		m.addrs[i] = r.addr
		h := &m.c.state.shared[i]
		h.consecutive5xx.Store(0)
		h.consecutiveConnectFail.Store(0)
		if m.hc != nil {
			m.healthy[i], m.known[i] = false, false
			m.successes[i], m.failures[i] = 0, 0
		}
		changed = true
	}
	return changed
}
