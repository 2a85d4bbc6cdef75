package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// holdInFlight starts a request to addr whose response the backend drips
// over 20s, reads its headers and leaves the rest in flight: the
// generation that accepted it drains until its drain_time ends.
func holdInFlight(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /drip?n=200&ms=20000 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /drip: %v %v", resp, err)
	}
	c.SetDeadline(time.Time{})
}

// TestReloadSaysWhatItWaitsFor: with max_draining_generations = 1 and
// every generation kept draining by a request in flight, the
// third reload in a row must wait for a hurried generation to exit (up to
// a drain_time). `hotproxy reload` used to print nothing all that time;
// now it says on stderr what it waits for and for how long at most, then
// the outcome.
func TestReloadSaysWhatItWaitsFor(t *testing.T) {
	requireServeContract(t)
	t.Parallel()
	backend := harness.StartHTTPBackend(t, "b1")
	c := httpProxyConfig(backend.Addr)
	c.DrainTime = "4s"
	c.ParentShutdownTime = "6s"
	c.Extra = "[hot_restart]\ncommit_window = \"300ms\"\nmax_draining_generations = 1\n"
	c = c.Allocate(t)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	addr := c.Listeners[0].Address

	holdInFlight(t, addr) // on epoch 0
	for i := 1; i <= 2; i++ {
		if res := s.cli("reload"); res.Code != 0 {
			t.Fatalf("reload %d: exit %d\n%s%s", i, res.Code, res.Stdout, res.Stderr)
		}
		holdInFlight(t, addr) // on epoch i
	}
	// Epoch 2 serves, 1 drains, 0 was hurried and drains out its 4s.
	start := time.Now()
	res := s.cli("reload")
	took := time.Since(start)
	if res.Code != 0 || !strings.Contains(res.Stdout, "epoch 3 serves") {
		t.Fatalf("third reload: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	wantContains(t, "hotproxy reload past max_draining_generations", res.Stderr,
		"hotproxy reload: waiting: ", "max_draining_generations = 1", "has exited", "server.drain_time (4s)")
	if n := strings.Count(res.Stderr, "waiting:"); n != 1 {
		t.Errorf("the wait was reported %d times, want once:\n%s", n, res.Stderr)
	}
	t.Logf("the third reload took %v and said:\n%s", took.Round(time.Millisecond), res.Stderr)
}
