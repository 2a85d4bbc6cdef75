package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestHotRestartRemovedListenerIsNeverReset: config A has the listeners
// "web" and "gone"; the next generation's config B lacks "gone". Clients
// connect to "gone" in a loop throughout the hand-over, its commit window
// and the old generation's drain. The old generation must stop the kernel
// from queueing connections into the socket nobody will accept on: a
// connection to "gone" is served, or refused once the socket is closed,
// but never accepted by the kernel and then reset (or closed without an
// answer). Traffic to "web" sees no failure at all.
func TestHotRestartRemovedListenerIsNeverReset(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	// A commit window long enough that connections queued in a socket
	// nobody accepts on would wait for it (and then be reset).
	cfg := restartConfig("2s", "3s", "2s", b.Addr)
	cfg.Listeners = append(cfg.Listeners, harness.Listener{
		Name:   "gone",
		Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "gone"}},
	})
	cfg = cfg.Allocate(t)
	c := startChain(t, cfg)
	g0 := c.serving
	goneURL := "http://" + cfg.Listeners[1].Address + "/"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var webLoads []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: g0.URL("web", "/"), Mode: mode, Clients: 2,
			Duration: 2 * time.Minute, Check: backendCheck("b1")})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		webLoads = append(webLoads, r)
	}
	// A refused port must not become a busy loop: a short pause after a
	// failure keeps the clients connecting in a loop without spinning.
	gone, err := loadgen.Start(ctx, loadgen.Options{URL: goneURL, Mode: loadgen.ConnPerRequest, Clients: 4,
		Duration: 2 * time.Minute, PauseAfterFailure: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Stop()
	for _, r := range append(webLoads, gone) {
		if !r.WaitTotal(300, 10*time.Second) {
			t.Fatalf("load did not start: %v", r.Snapshot())
		}
	}

	// Config B: the same, without "gone".
	b0, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	withoutGone := removeListener(t, string(b0), "gone")
	if err := os.WriteFile(c.cfgPath, []byte(withoutGone), 0o644); err != nil {
		t.Fatal(err)
	}
	g1, _ := c.restart()
	waitExit0(t, g0, exitTimeout)
	// Once the old generation is gone, "gone" refuses: the clients keep
	// trying for a while.
	refusedAt := gone.Snapshot().Count(loadgen.ClassRefused)
	deadline := time.Now().Add(10 * time.Second)
	for gone.Snapshot().Count(loadgen.ClassRefused) < refusedAt+50 && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
	}
	wantServing(t, g1)

	for i, r := range webLoads {
		r.WaitTotal(r.Snapshot().Total()+200, 10*time.Second)
		res := r.Stop()
		t.Logf("web load %d: %v", i, res)
		if res.Failed() != 0 {
			t.Errorf("web load %d: %d failed requests: %v", i, res.Failed(), res)
		}
	}
	res := gone.Stop()
	t.Logf("load on the removed listener: %v", res)
	if res.OK() == 0 || res.Count(loadgen.ClassRefused) == 0 {
		t.Fatalf("the test proves nothing: the removed listener answered %d requests and refused %d connections (want some of each)",
			res.OK(), res.Count(loadgen.ClassRefused))
	}
	resets := res.Count(loadgen.ClassReset) + res.Count(loadgen.ClassEOF)
	if other := res.FailedExcept(loadgen.ClassRefused); resets != 0 || other != 0 {
		t.Errorf("removed listener: %d connections reset or closed without an answer, %d failures in all but refusals; want none: %v",
			resets, other, res)
	}
}

// removeListener cuts the [[listeners]] table named name (with its routes)
// out of a config rendered by harness.Config.TOML.
func removeListener(t *testing.T, toml, name string) string {
	t.Helper()
	head := fmt.Sprintf("\n[[listeners]]\nname = %q\n", name)
	start := strings.Index(toml, head)
	if start < 0 {
		t.Fatalf("no listener %q in\n%s", name, toml)
	}
	// The table ends where the next top-level table begins (routes are
	// indented by the renderer).
	end := len(toml)
	if i := strings.Index(toml[start+len(head):], "\n["); i >= 0 {
		end = start + len(head) + i
	}
	return toml[:start] + toml[end:]
}

// TestHotRestartRollbackRebindsRemovedListener: the old generation closes
// the sockets of a listener its successor dropped as soon as the hand-over
// starts (see above); if the successor then dies within the commit window,
// the rollback binds that listener afresh and serves it again.
func TestHotRestartRollbackRebindsRemovedListener(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	cfg := restartConfig("1s", "2s", "5s", b.Addr)
	cfg.Listeners = append(cfg.Listeners, harness.Listener{
		Name:   "gone",
		Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "gone"}},
	})
	cfg = cfg.Allocate(t)
	c := startChain(t, cfg)
	g0 := c.serving
	goneURL := "http://" + cfg.Listeners[1].Address + "/"
	client := newClient(5 * time.Second)
	if _, body := get(t, client, goneURL); body != "gone" {
		t.Fatalf("before: %q", body)
	}

	b0, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.cfgPath, []byte(removeListener(t, string(b0), "gone")), 0o644); err != nil {
		t.Fatal(err)
	}
	child := c.launch(1, harness.LaunchOptions{})
	if err := child.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("%v\n%s", err, child.Output())
	}
	if err := g0.WaitStderr("the next generation does not take these sockets", 5*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, g0.Output())
	}
	// Closed once emptied: refused now.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := client.Get(goneURL)
		if err != nil && strings.Contains(err.Error(), "connection refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed listener still accepts 5s into the hand-over (last: %v)", err)
		}
		time.Sleep(pollEvery)
	}
	child.Signal(syscall.SIGKILL)
	if code := waitExitCode(t, child); code != -1 {
		t.Fatalf("SIGKILLed child: exit code %d", code)
	}
	if err := g0.WaitStderr("serving again after a failed hand-over", 5*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, g0.Output())
	}
	wantServing(t, g0)
	if resp, body := get(t, client, goneURL); resp.StatusCode != 200 || body != "gone" {
		t.Fatalf("after the rollback, the removed listener answers %d %q", resp.StatusCode, body)
	}
}
