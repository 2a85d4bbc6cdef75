package xds

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// Run leaves nothing running once its context ended: no stream, receive
// loop or connection goroutine outlives it, through reconnections too.
func TestRunLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		cp := startControlPlane(t, "127.0.0.1:0")
		cp.set("1", resources(t, "127.0.0.1:9001"))
		c, err := New(Config{Dial: DialTarget(cp.addr, nil), NodeID: testNode, BackoffBase: 10 * time.Millisecond,
			BackoffMax: 50 * time.Millisecond, SecretDir: t.TempDir() + "/s"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		nextUpdate(t, c, 10*time.Second).Done(nil)
		// A broken stream and a new one.
		addr := cp.addr
		cp.stop()
		cp2 := &controlPlane{tb: t, cache: cp.cache, notify: make(chan struct{}, 1)}
		cp2.serve(addr)
		cp2.waitRequest(0, "a request on the new stream", func(seenRequest) bool { return true })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
		cp2.stop()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
