package workers

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
)

// lockedBuffer is a log output tests read while workers write to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestGRPCToHTTP1ClusterIsLogged: a gRPC call routed to a cluster that
// speaks HTTP/1.1 fails at the gRPC server (every call a 502), and used to
// leave nothing in the log at info level. Now one rate-limited warning
// says what to change; gRPC-Web, which HTTP/1.1 carries, is not warned of.
func TestGRPCToHTTP1ClusterIsLogged(t *testing.T) {
	be := namedBackend(t, "up", 200, nil)
	cfg := &config.Config{
		Listeners: []config.Listener{httpListener("web", toCluster("/", "backend"))},
		Clusters:  []config.Cluster{cluster("backend", be)},
	}
	cfg.Listeners[0].HTTP2Cleartext = true
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	m, err := New(Options{Concurrency: 1, Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: &out})}, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Start()
	base := "http://" + addr(t, m, "web")
	c := h2cClient(t)

	web := newReq(t, "POST", base+"/svc.Echo/Say", strings.NewReader("x"))
	web.Header.Set("Content-Type", "application/grpc-web+proto")
	h2Do(t, c, web)
	if strings.Contains(out.String(), "gRPC") {
		t.Fatalf("gRPC-Web was warned of:\n%s", out.String())
	}
	for range 3 {
		req := newReq(t, "POST", base+"/svc.Echo/Say", strings.NewReader("x"))
		req.Header.Set("Content-Type", "application/grpc+proto")
		h2Do(t, c, req)
	}
	log := out.String()
	const want = "a gRPC request is routed to a cluster that speaks HTTP/1.1; gRPC needs HTTP/2 to its server: set http2 = true on the cluster"
	if n := strings.Count(log, want); n != 1 {
		t.Fatalf("%d warnings for 3 gRPC calls, want 1 (rate-limited):\n%s", n, log)
	}
	if !strings.Contains(log, "cluster=backend") || !strings.Contains(log, "listener=web") {
		t.Errorf("the warning does not name the listener and the cluster:\n%s", log)
	}
}
