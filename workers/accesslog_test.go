package workers

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// TestAccessLogOneLinePerRequest: proxied, direct and unrouted requests
// each leave exactly one line with what was sent.
func TestAccessLogOneLinePerRequest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	be := namedBackend(t, "up", 200, nil)
	lst := httpListener("web", toCluster("/api", "backend"),
		config.Route{Path: "/ok", DirectResponse: &config.DirectResponse{Status: 200, Body: "direct"}})
	lst.AccessLog = []config.AccessLog{{Path: path, Format: config.AccessLogJSON}}
	cfg := &config.Config{Listeners: []config.Listener{lst}, Clusters: []config.Cluster{cluster("backend", be)}}
	m := startManager(t, cfg, 2)
	c := newClient(t)
	want := map[string]int{}
	for i := range 30 {
		p := []string{"/api/x", "/ok", "/nowhere"}[i%3]
		p = fmt.Sprintf("%s?i=%d", p, i)
		resp, _ := get(t, c, "http://"+addr(t, m, "web")+p)
		want[p] = resp.StatusCode
	}
	m.Close() // writes out the queues
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines for %d requests:\n%s", len(lines), len(want), b)
	}
	for _, line := range lines {
		var rec struct {
			PATH             string
			RESPONSE_CODE    int
			UPSTREAM_HOST    string
			UPSTREAM_CLUSTER string
			BYTES_SENT       int
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		status, ok := want[rec.PATH]
		if !ok || status != rec.RESPONSE_CODE || rec.BYTES_SENT == 0 {
			t.Fatalf("line %q: want status %d", line, status)
		}
		delete(want, rec.PATH)
		if strings.HasPrefix(rec.PATH, "/api") != (rec.UPSTREAM_HOST == be && rec.UPSTREAM_CLUSTER == "backend") {
			t.Errorf("line %q: upstream", line)
		}
	}
}

// TestAccessLogFullQueueNeverStalls: the log's file is a FIFO nobody
// reads, so its writer is stuck; requests go on at full speed and the
// dropped lines are counted.
func TestAccessLogFullQueueNeverStalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Closing the reader unblocks the writer so the manager can close.
	t.Cleanup(func() { rd.Close() })
	lst := httpListener("web", config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "ok"}})
	lst.AccessLog = []config.AccessLog{{Path: path, Format: config.AccessLogJSON, QueueSize: 16}}
	m := startManager(t, &config.Config{Listeners: []config.Listener{lst}}, 1)
	t.Cleanup(func() { rd.Close() }) // runs before the manager's Close
	c := newClient(t)
	const n = 1500
	start := time.Now()
	for i := range n {
		if resp, _ := get(t, c, "http://"+addr(t, m, "web")+"/"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	elapsed := time.Since(start)
	dropped := lstat(m, statAccessLogDropped)
	if dropped == 0 {
		t.Fatal("no line dropped: the writer was not blocked, the test proves nothing")
	}
	if elapsed > 20*time.Second {
		t.Errorf("%d requests took %v with a stuck log", n, elapsed)
	}
	t.Logf("%d requests in %v, %d lines dropped", n, elapsed, dropped)
}

// TestAccessLogDirectoryCheckedFirst: a log whose directory is missing
// stops the snapshot build (fail fast, before a socket), naming the path.
func TestAccessLogDirectoryCheckedFirst(t *testing.T) {
	lst := httpListener("web", config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200}})
	lst.AccessLog = []config.AccessLog{{Path: "/nonexistent-hotproxy-dir/access.log", Format: config.AccessLogJSON}}
	cfg := &config.Config{Listeners: []config.Listener{lst}}
	cfg.SetDefaults()
	_, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err == nil || !strings.Contains(err.Error(), `listener "web": access_log 0: path "/nonexistent-hotproxy-dir/access.log"`) {
		t.Fatalf("error %v", err)
	}
}
