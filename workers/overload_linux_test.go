package workers

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// TestOverloadStopAcceptingInKernel: where the steering program is
// loaded, stop_accepting refuses new connections in the kernel (connect
// fails with ECONNREFUSED, nothing is accepted), and every refusal is in
// overload.stop_accepting.refused and overload.shed_total, exactly, over
// many turns on and off; off, new connections are served again; a
// connection accepted before is served throughout.
func TestOverloadStopAcceptingInKernel(t *testing.T) {
	requireSteering(t)
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL), func(l *config.Listener) { l.Balance = config.BalanceLeastConn }), 2)
	if m.listeners[0].steer == nil {
		t.Fatalf("least_conn listener runs no program: %v", m.listeners[0].steerErr)
	}
	if got := m.StopAcceptingModes()["web"]; got != StopAcceptingKernel {
		t.Fatalf("StopAcceptingModes()[web] = %q with the program, want %q", got, StopAcceptingKernel)
	}
	a := addr(t, m, "web")
	c := newClient(t)
	if resp, _ := get(t, c, "http://"+a+"/before"); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	accepted := counter(m, "listener.web."+statCxTotal)
	const turns, perTurn = 10, 3
	for turn := range turns {
		m.SetOverload(OverloadState{StopAccepting: true})
		for i := range perTurn {
			nc, err := net.DialTimeout("tcp", a, 5*time.Second)
			if err == nil {
				nc.Close()
				t.Fatalf("turn %d, dial %d: a new connection completed its handshake while not accepting", turn, i)
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("turn %d, dial %d: %v, want connection refused (by the program)", turn, i, err)
			}
		}
		if resp, _ := get(t, c, fmt.Sprintf("http://%s/kept%d", a, turn)); resp.StatusCode != 200 {
			t.Fatalf("turn %d: the connection accepted before: %d, want 200", turn, resp.StatusCode)
		}
		m.SetOverload(OverloadState{})
		if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: h\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("turn %d: accepting again: %d", turn, resp.StatusCode)
		}
	}
	m.CountKernelRefusals()
	want := uint64(turns * perTurn)
	if got := counter(m, "overload.stop_accepting.refused"); got != want {
		t.Errorf("overload.stop_accepting.refused = %d, want %d (the dials refused)", got, want)
	}
	if got := counter(m, "overload.shed_total"); got != want {
		t.Errorf("overload.shed_total = %d, want %d", got, want)
	}
	if got := counter(m, "overload.stop_accepting.closed"); got != 0 {
		t.Errorf("overload.stop_accepting.closed = %d, want 0: the kernel refused them, none reached accept", got)
	}
	// Accepted: the one raw request per turn, nothing refused.
	if got := counter(m, "listener.web."+statCxTotal) - accepted; got != turns {
		t.Errorf("%d connections accepted during the turns, want %d (one per turn off)", got, turns)
	}
}
