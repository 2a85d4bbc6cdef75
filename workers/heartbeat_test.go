package workers

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
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

// TestBusyAcceptLoopMovesItsDeadlineRarely: an accept loop that accepts
// connection after connection moves its heartbeat deadline about twice
// per interval, not once per connection (a clock read and a timer reset
// per connection, before).
func TestBusyAcceptLoopMovesItsDeadlineRarely(t *testing.T) {
	be := echoBackend(t)
	cfg := proxyConfig(hostOf(be.URL))
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	const interval = time.Minute // longer than the test: the bound is moves per connection
	m, err := New(Options{Concurrency: 1, Logger: testLogger(), HeartbeatInterval: interval}, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Start()
	const conns = 30
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection %d: %v %v", i, resp, err)
		}
		c.Close()
	}
	m.mu.Lock()
	beats := m.beats
	m.mu.Unlock()
	var moves int64
	for _, b := range beats {
		moves += b.hb.deadlineMoves.Load()
	}
	t.Logf("%d accept loops moved their deadline %d times for %d connections", len(beats), moves, conns)
	if moves > int64(2*len(beats)) {
		t.Fatalf("%d accept loops moved their heartbeat deadline %d times for %d connections within one interval: once per connection", len(beats), moves, conns)
	}
}
