package workers

import (
	"context"
	"testing"
	"time"
)

// TestIdleAcceptLoopsKeepTheirHeartbeat: with nothing to accept, every
// worker's accept loops still store a heartbeat within the interval (they
// wake for it), the listener still serves, and a drain still ends the
// loops at once (the heartbeat's deadline does not hide the drain's).
func TestIdleAcceptLoopsKeepTheirHeartbeat(t *testing.T) {
	be := echoBackend(t)
	for _, reusePort := range []bool{true, false} {
		cfg := proxyConfig(hostOf(be.URL))
		cfg.Server.ReusePort = boolp(reusePort)
		cfg.SetDefaults()
		snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 2)
		if err != nil {
			t.Fatal(err)
		}
		const interval = 20 * time.Millisecond
		m, err := New(Options{Concurrency: 2, Logger: testLogger(), HeartbeatInterval: interval}, snap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if m.WorkerHeartbeatAges(nil) != nil {
			t.Fatal("heartbeat ages before Start")
		}
		m.Start()
		// Idle for many intervals: a loop that only beats when a
		// connection arrives would age past the bound.
		bound := 50 * interval
		deadline := time.Now().Add(40 * interval)
		for samples := 0; time.Now().Before(deadline) || samples < 10; samples++ {
			ages := m.WorkerHeartbeatAges(nil)
			if len(ages) != 2 {
				t.Fatalf("reuse_port=%v: %d ages for 2 workers", reusePort, len(ages))
			}
			for w, age := range ages {
				if age > bound {
					t.Fatalf("reuse_port=%v: worker %d's heartbeat is %s old with an interval of %s", reusePort, w, age, interval)
				}
			}
			time.Sleep(interval)
		}
		c := newClient(t)
		if resp, body := get(t, c, "http://"+addr(t, m, "web")+"/x"); resp.StatusCode != 200 {
			t.Fatalf("reuse_port=%v: request through a heartbeating listener: %d %q", reusePort, resp.StatusCode, body)
		}
		c.CloseIdleConnections()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := m.Drain(ctx, DrainOptions{HTTPTimeout: time.Second}); err != nil {
			t.Fatal(err)
		}
		cancel()
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("drain took %s", took)
		}
		if m.WorkerHeartbeatAges(nil) != nil {
			t.Fatal("heartbeat ages after the accept loops ended")
		}
	}
}
