package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestStatsRegionTruncatedUnderLoad: the stats region of a serving hotproxy
// is truncated by another process (coreutils truncate) again and again
// while a load runs through it. This used to kill the process with SIGBUS
// at the next gauge refresh or counter add. Now every request succeeds,
// /ready stays 200, the file is restored, the truncations are counted in
// stats.region_truncated and logged, and the counters count on afterwards.
func TestStatsRegionTruncatedUnderLoad(t *testing.T) {
	t.Parallel()
	truncate, err := exec.LookPath("truncate")
	if err != nil {
		t.Skip("needs coreutils truncate to truncate the region from another process")
	}
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		t.Skip("no /dev/shm (tmpfs), where regions live in production")
	}
	b := harness.StartHTTPBackend(t, "b1")
	reg := newStatsRegion(t)
	reg.Path = filepath.Join("/dev/shm", fmt.Sprintf("hotproxy-it-%d-%d.stats", os.Getpid(), reg.BaseID))
	t.Cleanup(func() { os.Remove(reg.Path) })
	p := reg.start(t, httpProxyConfig(b.Addr))
	fi, err := os.Stat(reg.Path)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()

	run, err := loadgen.Start(context.Background(), loadgen.Options{
		URL: p.URL("web", "/"), Mode: loadgen.KeepAlive, Clients: 4, Duration: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Stop()
	const truncations = 5
	for i := 0; i < truncations; i++ {
		if !run.WaitTotal(run.Snapshot().Total()+200, 20*time.Second) {
			t.Fatalf("truncation %d: the load stalled: %s", i, run.Snapshot())
		}
		if out, err := exec.Command(truncate, "-s", "0", reg.Path).CombinedOutput(); err != nil {
			t.Fatalf("truncate: %v: %s", err, out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			fi, err := os.Stat(reg.Path)
			if err == nil && fi.Size() == size {
				break
			}
			if p.Exited() || time.Now().After(deadline) {
				t.Fatalf("truncation %d: region not restored (exited: %v)\n%s", i, p.Exited(), p.Stderr())
			}
			time.Sleep(time.Millisecond)
		}
		if code, body := p.AdminGet("/ready"); code != http.StatusOK {
			t.Fatalf("truncation %d: /ready %d %s", i, code, body)
		}
	}
	if !run.WaitTotal(run.Snapshot().Total()+200, 20*time.Second) {
		t.Fatalf("the load stalled after the truncations: %s", run.Snapshot())
	}
	res := run.Stop()
	if res.Failed() != 0 || p.Exited() {
		t.Fatalf("requests failed across the truncations (process exited: %v): %s\n%s", p.Exited(), res, p.Stderr())
	}
	t.Logf("load across %d truncations: %s", truncations, res)

	// The flush (every 100ms) counts what the watcher restored.
	deadline := time.Now().Add(10 * time.Second)
	v := getStats(t, p)
	for v["stats.region_truncated"] < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats.region_truncated = %d, want >= 1", v["stats.region_truncated"])
		}
		time.Sleep(statsFlush)
		v = getStats(t, p)
	}
	if !strings.Contains(p.Stderr(), "stats region file was truncated") {
		t.Errorf("no log line about the truncation:\n%s", p.Stderr())
	}
	before := v["listener.web.downstream_rq_total"]
	ok := runLoad(t, p, 100, loadgen.KeepAlive).OK()
	if got := getStats(t, p)["listener.web.downstream_rq_total"]; got < before+ok {
		t.Errorf("downstream_rq_total %d after %d more requests, was %d", got, ok, before)
	}
}
