package integration

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestHotRestartConcurrencyWithSteering is issue 14's integration test:
// under connection-per-request load, 20 round trips of hot restarts from
// concurrency 4 to 1 and back (40 restarts), with the eBPF program on and
// the queue emptying of a stopping generation switched off, so that only
// the program's migration can save a connection queued in a socket that
// closes. Zero failed connections; the sockets a generation drops close
// within milliseconds of the hand-over.
func TestHotRestartConcurrencyWithSteering(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the eBPF program needs CAP_BPF: run as root")
	}
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("needs ss (iproute2) to count the listening sockets")
	}
	const roundTrips = 20
	// Every generation of the chain inherits this: a drain closes its
	// sockets at once instead of first accepting what is queued.
	t.Setenv("HOTPROXY_QUEUE_EMPTYING", "off")

	b := harness.StartHTTPBackend(t, "b1")
	cfg := restartConfig("1s", "2s", "100ms", b.Addr)
	cfg.Concurrency = 4
	c := startChain(t, cfg)
	port := portOf(t, c.serving.Addr("web"))
	wantSteering(t, c.serving)

	load := startSteadyLoad(t, loadgen.Options{
		URL: c.serving.URL("web", "/"), Mode: loadgen.ConnPerRequest, Clients: 8,
		Requests: 1000, Timeout: 5 * time.Second, Check: backendCheck("b1"),
	})
	load.WaitMore(t, 200)

	var closeTimes []time.Duration
	start := time.Now()
	for i := range 2 * roundTrips {
		n := 1
		if i%2 == 1 {
			n = 4
		}
		setConcurrency(t, c.cfgPath, n)
		child, parent := c.restart()
		ready := time.Now()
		// The new generation holds n sockets; the parent's extra ones
		// close when it drains, which the child starts at ready.
		deadline := ready.Add(5 * time.Second)
		for {
			got := listenersOnPort(t, port)
			if got == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("restart %d (to concurrency %d): %d sockets listen on port %d 5s after ready, want %d", i+1, n, got, port, n)
			}
			time.Sleep(time.Millisecond)
		}
		if n == 1 {
			closeTimes = append(closeTimes, time.Since(ready))
		}
		wantSteering(t, child)
		waitExit0(t, parent, exitTimeout)
		if res := load.Snapshot(); res.Failed() != 0 {
			t.Fatalf("restart %d (to concurrency %d): failures: %v", i+1, n, res)
		}
		load.WaitMore(t, 50) // load goes on between restarts
	}
	elapsed := time.Since(start)
	load.WaitMore(t, 200)
	res := load.Stop()
	migrated, _ := adminStats(t, c.serving).counter("listener.web.balance_migrated")
	t.Logf("%d restarts (4->1->4 x%d) in %v; load: %v", 2*roundTrips, roundTrips, elapsed.Round(time.Millisecond), res)
	t.Logf("after ready, the dropped sockets were closed in p50 %v, max %v; newest generation's balance_migrated: %d",
		pct(closeTimes, 50), pct(closeTimes, 100), migrated)
	if res.Failed() != 0 {
		t.Errorf("%d failed connections: %v", res.Failed(), res)
	}
	if res.Total() < 2000 {
		t.Errorf("only %d requests ran across the restarts, want at least 2000: the test proves little", res.Total())
	}
	if max := pct(closeTimes, 100); max > 500*time.Millisecond {
		t.Errorf("dropped sockets took up to %v to close after the hand-over, want milliseconds", max)
	}
}

var concurrencyLine = regexp.MustCompile(`(?m)^concurrency = \d+$`)

// setConcurrency rewrites the chain's config file for the next generation.
func setConcurrency(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !concurrencyLine.Match(b) {
		t.Fatalf("%s has no concurrency line:\n%s", path, b)
	}
	b = concurrencyLine.ReplaceAll(b, []byte(fmt.Sprintf("concurrency = %d", n)))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantSteering fails unless g logged that its listener runs the program.
func wantSteering(t *testing.T, g *harness.Generation) {
	t.Helper()
	if err := g.WaitStderr("listener balance", 5*time.Second); err != nil {
		t.Fatalf("epoch %d logged no balance line: %v\n%s", g.Epoch, err, g.Output())
	}
	out := g.Stderr()
	if strings.Contains(out, "falling back") || !strings.Contains(out, "balance=least_conn") {
		t.Fatalf("epoch %d does not run the eBPF program:\n%s", g.Epoch, out)
	}
}

// listenersOnPort counts the listening TCP sockets on port, any process.
// It asks the kernel with ss (sock_diag, filtered by state and port):
// /proc/net/tcp lists every TIME_WAIT socket the load leaves behind, and
// reading it takes longer than what is measured here.
func listenersOnPort(t *testing.T, port int) int {
	t.Helper()
	out, err := exec.Command("ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	return strings.Count(string(out), "\n")
}
