package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/shm"
)

// TestStatsConfigFindsTheInstance: `hotproxy stats -c CONFIG` for a
// config without a [stats] path, and no --base-id, used to read base-id
// 0's region, whatever instance that was (stale counters of another run,
// or none). Now it reads the region of the live instance that runs CONFIG
// (the base-id is on its command line only), and for a config no live
// instance runs it says so, naming what to give instead.
func TestStatsConfigFindsTheInstance(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	c := httpProxyConfig(b.Addr)
	// A [stats] table without a path: the region is the base-id's default.
	c.Extra = "[stats]\nflush_interval = \"1s\"\n"
	id := harness.UniqueBaseID()
	t.Cleanup(func() { os.Remove(shm.DefaultPath(uint64(id))) })
	p := harness.StartProxy(t, c.Allocate(t).TOML(), "--base-id", strconv.Itoa(id))
	const n = 7
	sendRequests(t, p, n)

	want := fmt.Sprintf("listener.web.downstream_rq_total: %d\n", n)
	deadline := time.Now().Add(5 * time.Second)
	for {
		res := statsCLI(t, 0, "-c", p.ConfigPath, "--filter", `^listener\.web\.downstream_rq_total$`)
		if res.Stdout == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats -c %s: %q, want %q (the region of base-id %d)\n%s", p.ConfigPath, res.Stdout, want, id, res.Stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// top finds it the same way.
	res := harness.Run(t, "top", "-c", p.ConfigPath, "--frames", "1", "--size", "120x30")
	if res.Code != 0 || !strings.Contains(res.Stdout, shm.DefaultPath(uint64(id))) {
		t.Errorf("top -c %s: exit %d, frame does not name the region %s:\n%s%s", p.ConfigPath, res.Code, shm.DefaultPath(uint64(id)), res.Stdout, res.Stderr)
	}

	// A config that no live instance runs.
	other := filepath.Join(t.TempDir(), "nobody-runs-me.toml")
	if err := os.WriteFile(other, []byte(c.Allocate(t).TOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	res = statsCLI(t, 1, "-c", other)
	wantContains(t, "stats -c for a config nobody runs", res.Stderr, other, "no live hotproxy generation runs it", "--base-id")
	// --base-id still says which instance, as before.
	res = statsCLI(t, 0, "-c", other, "--base-id", strconv.Itoa(id), "--filter", `^listener\.web\.downstream_rq_total$`)
	if res.Stdout != want {
		t.Errorf("stats -c other --base-id %d: %q, want %q", id, res.Stdout, want)
	}
}
