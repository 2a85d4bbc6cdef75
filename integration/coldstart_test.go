package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestSecondColdStartWarns: a base-id whose generation has been hot
// restarted to epoch 1 leaves epoch 0's restart socket free, so a second
// cold `serve` of it (epoch 0) is not refused by the hand-over; it must
// say loudly that it starts beside a live generation, naming its pid and
// epoch, the region, and what to do. The first cold start, with nothing
// running, says nothing of the kind.
func TestSecondColdStartWarns(t *testing.T) {
	t.Parallel()
	const warning = "COLD START BESIDE A RUNNING INSTANCE"
	cfg := harness.Config{
		Concurrency: 1,
		DrainTime:   "1s",
		Listeners:   []harness.Listener{{Name: "web", Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "ok\n"}}}},
	}
	path := harness.WriteConfig(t, cfg.Allocate(t).TOML())
	baseID := harness.UniqueBaseID()

	g0 := harness.StartGeneration(t, path, baseID, 0, harness.LaunchOptions{})
	if err := g0.WaitReadyFD(15 * time.Second); err != nil {
		t.Fatalf("epoch 0: %v\n%s", err, g0.Output())
	}
	g1 := harness.StartGeneration(t, path, baseID, 1, harness.LaunchOptions{})
	if err := g1.WaitReadyFD(15 * time.Second); err != nil {
		t.Fatalf("epoch 1: %v\n%s", err, g1.Output())
	}
	if _, err := g0.Wait(15 * time.Second); err != nil {
		t.Fatalf("epoch 0 did not exit after handing over: %v", err)
	}
	if strings.Contains(g0.Stderr(), warning) || strings.Contains(g1.Stderr(), warning) {
		t.Fatalf("a start with nothing else running warned:\n%s\n%s", g0.Stderr(), g1.Stderr())
	}

	// Another config of the same instance (same stats region), on other
	// ports, so that only the warning can tell.
	other := harness.WriteConfig(t, cfg.Allocate(t).TOML())
	cold := harness.StartGeneration(t, other, baseID, 0, harness.LaunchOptions{})
	_ = cold.WaitReadyFD(15 * time.Second) // serving or not, the warning comes first
	out := cold.Stderr()
	for _, want := range []string{warning, "[WARN]", "pid " + strconv.Itoa(g1.PID()) + " epoch 1", harness.StatsPath(t), "--restart-epoch 2", "--base-id"} {
		if !strings.Contains(out, want) {
			t.Errorf("second cold start: stderr lacks %q:\n%s", want, out)
		}
	}
}
