package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// roundResult is one round's outcome per endpoint.
type roundResult []bool

// wait is the time to the next round: the interval and a jitter.
func (m *Monitor) wait() time.Duration {
	d := m.hc.Interval.D()
	if j := int64(d) * config.HealthCheckJitterPercent / 100; j > 0 {
		d += time.Duration(rand.Int64N(j))
	}
	return d
}

// round checks every endpoint at once (at addrs, the monitor's copy
// when the round started), each bounded by the timeout.
func (m *Monitor) round(ctx context.Context, addrs []string) roundResult {
	res := make(roundResult, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, m.hc.Timeout.D())
			defer cancel()
			res[i] = m.check(cctx, i, addr)
		}()
	}
	wg.Wait()
	return res
}

// check is one health check of endpoint i at addr: a TCP connect, or an
// HTTP/1.1 GET of the path whose status must be expected. It never obeys
// HTTP_PROXY: it speaks to the endpoint itself.
//
// For a TLS cluster the GET goes over TLS, with the configuration requests
// use (a certificate that does not verify fails the check), while a TCP
// check stays a TCP connect: it says the endpoint listens, not that it
// would shake hands. Health-check handshakes are not counted in
// cluster.<name>.ssl.*, which are the workers' connections.
func (m *Monitor) check(ctx context.Context, i int, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if m.hc.Path == "" {
		return true
	}
	if cfg := m.c.ClientTLS(i); cfg != nil {
		if len(cfg.NextProtos) > 0 {
			// An http2 cluster offers "h2"; this check speaks
			// HTTP/1.1, which a server assumes without ALPN.
			cfg = cfg.Clone()
			cfg.NextProtos = nil
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return false
		}
		conn = tc
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// Close the connection when ctx ends early (Stop), so the read below
	// does not outlive it.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "GET " + m.hc.Path + " HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: hotproxy-health-check\r\nConnection: close\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return slices.Contains(m.hc.ExpectedStatuses, resp.StatusCode)
}

// apply moves each endpoint's health by one round's results.
func (m *Monitor) apply(r roundResult) {
	for i, ok := range r {
		m.count(ok)
		was, known := m.healthy[i], m.known[i]
		m.known[i] = true
		if ok {
			m.failures[i] = 0
			m.successes[i]++
			if !was && (!known || m.successes[i] >= m.hc.HealthyThreshold) {
				m.healthy[i] = true
			}
		} else {
			m.successes[i] = 0
			m.failures[i]++
			if was && m.failures[i] >= m.hc.UnhealthyThreshold {
				m.healthy[i] = false
			}
		}
		if m.healthy[i] != was || !known {
			m.log.Info("endpoint health", "endpoint", m.addrs[i], "healthy", m.healthy[i], "first_check", !known)
		}
	}
}

func (m *Monitor) count(ok bool) {
	if m.st == nil {
		m.attempts++
		if ok {
			m.passes++
		} else {
			m.fails++
		}
		return
	}
	m.st.attempt.Inc()
	if ok {
		m.st.success.Inc()
	} else {
		m.st.failure.Inc()
	}
}
