package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// backendOn starts an HTTP backend answering name on addr, or skips the
// test if addr cannot be bound.
func backendOn(tb testing.TB, name, addr string) {
	tb.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		tb.Skipf("cannot listen on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	tb.Cleanup(srv.Close)
}

// fakeDNS makes the name app.test resolve to what answer holds ("" fails
// the lookup) for the rest of the test. Register it before anything that
// resolves, so that it is restored after the monitor stops.
func fakeDNS(tb testing.TB, answer *atomic.Value) {
	real := lookupHost
	lookupHost = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host != "app.test" {
			return real(ctx, host)
		}
		ip, _ := answer.Load().(string)
		if ip == "" {
			return nil, errors.New("no such host (test)")
		}
		return []netip.Addr{netip.MustParseAddr(ip)}, nil
	}
	tb.Cleanup(func() { lookupHost = real })
}

// TestDNSRefreshMovesTrafficAndKeepsLastGood: a name whose address
// changes moves the traffic (pooled connections to the old address are
// not reused); a name that stops resolving keeps the last good address
// and counts the failure.
func TestDNSRefreshMovesTrafficAndKeepsLastGood(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	backendOn(t, "one", "127.0.0.1:"+port)
	backendOn(t, "two", "127.0.0.2:"+port)

	var answer atomic.Value
	answer.Store("127.0.0.1")
	fakeDNS(t, &answer)
	c, wc, _, st := newMonitored(t, config.Cluster{
		Endpoints:  []string{"app.test:" + port},
		DNSRefresh: config.Duration(20 * time.Millisecond),
	})
	for range 3 {
		if _, body := exchange(t, wc); body != "one" {
			t.Fatalf("answered by %q, want one", body)
		}
	}
	if wc.IdleConns() == 0 {
		t.Fatal("no pooled connection to the old address: the test proves nothing about reuse")
	}
	answer.Store("127.0.0.2")
	waitFor(t, 5*time.Second, "the endpoint moved to 127.0.0.2", func() bool {
		return c.state.hosts.Load().addrs[0] == "127.0.0.2:"+port
	})
	for range 3 {
		if _, body := exchange(t, wc); body != "two" {
			t.Fatalf("after the move, answered by %q, want two", body)
		}
	}
	failures := st.Counter("cluster.backend.update_failure")
	answer.Store("")
	waitFor(t, 5*time.Second, "a failed lookup counted", func() bool { return failures.Value() >= 2 })
	if a := c.state.hosts.Load().addrs[0]; a != "127.0.0.2:"+port {
		t.Fatalf("after failed lookups the endpoint is %q, want the last good address", a)
	}
	if _, body := exchange(t, wc); body != "two" {
		t.Fatalf("after failed lookups, answered by %q, want two", body)
	}
	if c.Status().Endpoints[0].Address != "127.0.0.2:"+port {
		t.Errorf("status shows %q", c.Status().Endpoints[0].Address)
	}
	if st.Counter("cluster.backend.update_success").Value() == 0 {
		t.Error("update_success not counted")
	}
}
