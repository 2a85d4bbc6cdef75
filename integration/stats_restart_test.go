package integration

import (
	"bytes"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestStatsContinuousAcrossCleanExit: proxy A serves N requests and stops
// on SIGTERM (its counters fold into the region's retired totals); proxy B
// starts on the same region and serves M more. B shows N+M.
func TestStatsContinuousAcrossCleanExit(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	reg := newStatsRegion(t)

	const n, m = 300, 200
	a := reg.start(t, httpProxyConfig(b.Addr))
	resA := runLoad(t, a, n, loadgen.KeepAlive)
	vA := getStats(t, a)
	wantRequests(t, vA, resA.OK(), resA.Retried)
	if code := a.Stop(); code != 0 {
		t.Fatalf("A exited %d:\n%s", code, a.Output())
	}

	bp := reg.start(t, httpProxyConfig(b.Addr))
	resB := runLoad(t, bp, m, loadgen.ConnPerRequest)
	vB := getStats(t, bp)
	wantRequests(t, vB, vA["listener.web.downstream_rq_total"]+resB.OK(), resB.Retried)
	if got, want := vB["listener.web.downstream_cx_total"], vA["listener.web.downstream_cx_total"]+m; got != want {
		t.Errorf("downstream_cx_total %d, want %d (A's %d + %d connections)", got, want, vA["listener.web.downstream_cx_total"], m)
	}
	if got, want := vB["cluster.backend.upstream_rq_total"], vA["cluster.backend.upstream_rq_total"]+m; got != want {
		t.Errorf("upstream_rq_total %d, want %d", got, want)
	}
	// The histogram carries A's samples too once B has flushed.
	waitStat(t, bp, "listener.web.downstream_rq_time", vB["listener.web.downstream_rq_total"], 5*time.Second)
	if vB["server.live"] != 1 || vB["server.hot_restart_epoch"] != 0 {
		t.Errorf("server.live %d, server.hot_restart_epoch %d", vB["server.live"], vB["server.hot_restart_epoch"])
	}
}

// TestStatsSurviveKill: proxy A serves N requests, holds a client
// connection open and is killed with SIGKILL; proxy B attaches to the same
// region, folds the dead generation and serves M more. B shows exactly
// N+M requests, and A's open connection no longer counts in
// downstream_cx_active.
func TestStatsSurviveKill(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	reg := newStatsRegion(t)

	const n, m = 300, 200
	a := reg.start(t, httpProxyConfig(b.Addr))
	resA := runLoad(t, a, n, loadgen.KeepAlive)
	held, err := net.DialTimeout("tcp", a.Addr("web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	vA := waitStatAtLeast(t, a, "listener.web.downstream_cx_active", 1, 5*time.Second)
	wantRequests(t, vA, resA.OK(), resA.Retried)

	a.Signal(syscall.SIGKILL)
	if _, err := a.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	held.Close()

	bp := reg.start(t, httpProxyConfig(b.Addr))
	resB := runLoad(t, bp, m, loadgen.ConnPerRequest)
	vB := getStats(t, bp)
	if got, want := vB["listener.web.downstream_rq_total"], vA["listener.web.downstream_rq_total"]+resB.OK(); got != want {
		t.Errorf("downstream_rq_total %d, want %d (A's %d, folded after SIGKILL, + B's %d)", got, want, vA["listener.web.downstream_rq_total"], resB.OK())
	}
	wantRequests(t, vB, vA["listener.web.downstream_rq_total"]+resB.OK(), resB.Retried)
	// B's own connections close after each request: once they are all
	// gone the gauge is 0, which it could not be if A's lane still counted.
	waitStat(t, bp, "listener.web.downstream_cx_active", 0, 5*time.Second)
	if got := vB["server.live"]; got != 1 {
		t.Errorf("server.live %d, want 1 (B's; A's lane is gone)", got)
	}
}

// waitStatAtLeast polls /stats until name is at least min.
func waitStatAtLeast(t *testing.T, p *harness.Proxy, name string, min int64, timeout time.Duration) statValues {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := getStats(t, p)
		if v[name] >= min {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d after %v, want at least %d", name, v[name], timeout, min)
		}
		time.Sleep(statsFlush / 2)
	}
}

// TestStatsRefusesForeignRegion: a file at the configured stats path that
// is not a region stops `hotproxy serve` with an error naming the path,
// and the file is left as it was.
func TestStatsRefusesForeignRegion(t *testing.T) {
	t.Parallel()
	reg := newStatsRegion(t)
	garbage := bytes.Repeat([]byte("this is not a hotproxy stats region\n"), 200)
	if err := os.WriteFile(reg.Path, garbage, 0o640); err != nil {
		t.Fatal(err)
	}
	p := harness.Launch(t, reg.config(directConfig()).Allocate(t).TOML(), reg.args()...)
	code, err := p.Wait(harness.DefaultReadyTimeout)
	if err != nil {
		t.Fatalf("serve kept running on a foreign stats file: %v\n%s", err, p.Output())
	}
	if code == 0 {
		t.Fatalf("serve exited 0 on a foreign stats file:\n%s", p.Output())
	}
	wantContains(t, "serve's error", p.Stderr(), reg.Path)
	after, err := os.ReadFile(reg.Path)
	if err != nil || !bytes.Equal(after, garbage) {
		t.Errorf("the foreign file was changed (%v)", err)
	}
}
