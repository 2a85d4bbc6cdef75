package integration

import (
	"context"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestNoFDLeakUnderLoad runs connection-per-request and keep-alive load,
// then checks that the proxy's open file descriptors come back to where
// they were after a warm-up (upstream pools may keep a few).
func TestNoFDLeakUnderLoad(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	load := func(mode loadgen.Mode, n int) {
		t.Helper()
		res, err := loadgen.Do(context.Background(), loadgen.Options{
			URL: p.URL("web", "/"), Mode: mode, Clients: 4, Requests: n, Duration: 30 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.OK() != int64(n) || res.Failed() != 0 {
			t.Fatalf("load: %v", res)
		}
	}
	load(loadgen.ConnPerRequest, 100)
	before, err := p.FDCount()
	if err != nil {
		t.Skipf("cannot count the proxy's fds: %v", err)
	}
	load(loadgen.ConnPerRequest, 500)
	load(loadgen.KeepAlive, 500)
	// Client connections close as their clients go; give the proxy a
	// moment to see the FINs.
	var after int
	deadline := time.Now().Add(5 * time.Second)
	for {
		after, err = p.FDCount()
		if err != nil {
			t.Fatal(err)
		}
		if after <= before+8 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("proxy fds: %d after warm-up, %d after 1000 more requests", before, after)
	if after > before+8 {
		t.Errorf("proxy fds grew from %d to %d over 1000 requests", before, after)
	}
}
