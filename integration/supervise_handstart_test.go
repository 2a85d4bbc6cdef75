package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestSupervisedGenerationRefusesHandStartedSuccessor: with `hotproxy
// supervise` running, an operator types `hotproxy serve --restart-epoch 1`
// by hand. Were it let in, it would take the sockets, the supervised
// generation would drain and exit, and the supervisor, with nothing left
// to run, would exit too: the service would be left to a process nobody
// supervises. Instead the hand-started generation is refused and exits
// non-zero saying to use `hotproxy reload`; the supervised generation
// serves on without a failed request, and `hotproxy reload` still works.
func TestSupervisedGenerationRefusesHandStartedSuccessor(t *testing.T) {
	requireServeContract(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	before := s.mustStatus()
	gen0, ok := before.Serving()
	if !ok || gen0.Epoch != 0 {
		t.Fatalf("before: %+v", before)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	load, err := loadgen.Start(ctx, loadgen.Options{URL: "http://" + c.Listeners[0].Address + "/", Mode: loadgen.KeepAlive, Clients: 2, Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer load.Stop()
	if !load.WaitTotal(200, 10*time.Second) {
		t.Fatalf("load did not start: %v", load.Snapshot())
	}

	hand := harness.LaunchFile(t, s.cfgPath, harness.LaunchOptions{
		Binary: s.bin,
		Args:   []string{"--base-id", fmt.Sprint(s.baseID), "--restart-epoch", "1"},
	})
	code, err := hand.Wait(30 * time.Second)
	if err != nil {
		t.Fatalf("the hand-started generation still runs 30s later (it took over?): %v\n%s", err, hand.Output())
	}
	if code == 0 {
		t.Fatalf("the hand-started generation exited 0\n%s", hand.Output())
	}
	wantContains(t, "the hand-started generation's stderr", hand.Stderr(),
		"refused", "unsupervised", "hotproxy reload", fmt.Sprintf("kill -HUP %d", s.supervisorPID()))
	if !strings.Contains(s.out.String(), "refused a peer on the restart socket: this generation runs under a supervisor") {
		t.Errorf("the supervised generation did not log the refusal\n%s", s.out.String())
	}

	load.WaitTotal(load.Snapshot().Total()+200, 10*time.Second)
	if s.exited() {
		t.Fatalf("the supervisor exited\n%s", s.out.String())
	}
	if g, ok := s.mustStatus().Serving(); !ok || g.PID != gen0.PID {
		t.Fatalf("after the refusal: serving %+v (ok %v), want epoch 0 pid %d", g, ok, gen0.PID)
	}

	if res := s.cli("reload"); res.Code != 0 || !strings.Contains(res.Stdout, "epoch 1 serves") {
		t.Fatalf("hotproxy reload after the refusal: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	load.WaitTotal(load.Snapshot().Total()+200, 10*time.Second)
	res := load.Stop()
	t.Logf("load: %v", res)
	if res.Failed() != 0 {
		t.Errorf("%d failed requests: %v", res.Failed(), res)
	}
	if g, ok := s.mustStatus().Serving(); !ok || g.Epoch != 1 {
		t.Errorf("after the reload: serving %+v (ok %v), want epoch 1", g, ok)
	}
}
