package workers

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// connCountingBackend answers 200 with body and counts the TCP connections it
// accepted.
func connCountingBackend(tb testing.TB, body string) (addr string, conns *atomic.Int64) {
	tb.Helper()
	conns = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(body))
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	return hostOf(srv.URL), conns
}

// TestPublishCarriesUnchangedCluster: a snapshot built from the previous
// one (BuildSnapshotFrom, what a dynamic update does) keeps the very
// cluster whose spec did not change, its workers' keep-alive pools with
// it, and builds anew the one whose spec changed.
func TestPublishCarriesUnchangedCluster(t *testing.T) {
	aAddr, aConns := connCountingBackend(t, "a")
	bAddr, _ := connCountingBackend(t, "b")
	cfg1 := &config.Config{
		Listeners: []config.Listener{httpListener("web", toCluster("/", "a"))},
		Clusters:  []config.Cluster{cluster("a", aAddr)},
	}
	m := startManager(t, cfg1, 1)
	base := "http://" + addr(t, m, "web")
	c := newClient(t)
	for range 3 {
		if _, body := get(t, c, base+"/"); body != "a" {
			t.Fatalf("before: body %q", body)
		}
	}
	if n := aConns.Load(); n != 1 {
		t.Fatalf("before the update: backend a saw %d connections, want 1 (pooled)", n)
	}
	m.mu.Lock()
	snap1 := m.snap
	m.mu.Unlock()

	// A route and a cluster added; cluster a unchanged.
	cfg2 := &config.Config{
		Listeners: []config.Listener{httpListener("web", toCluster("/b", "b"), toCluster("/", "a"))},
		Clusters:  []config.Cluster{cluster("a", aAddr), cluster("b", bAddr)},
	}
	cfg2.SetDefaults()
	snap2, err := BuildSnapshotFrom(cfg2, Identity{}, 1, snap1)
	if err != nil {
		t.Fatal(err)
	}
	if !snap2.SharesCluster(snap1, "a") || snap2.SharesCluster(snap1, "b") {
		t.Fatalf("carried a: %v, b: %v; want a only", snap2.SharesCluster(snap1, "a"), snap2.SharesCluster(snap1, "b"))
	}
	m.Publish(snap2)
	if _, body := get(t, c, base+"/b"); body != "b" {
		t.Fatalf("the added route: body %q", body)
	}
	for range 3 {
		if _, body := get(t, c, base+"/"); body != "a" {
			t.Fatalf("after: body %q", body)
		}
	}
	if n := aConns.Load(); n != 1 {
		t.Fatalf("after an update that left cluster a alone: backend a saw %d connections, want 1 (its pool carried over)", n)
	}

	// Cluster a changed (its connect timeout): built anew, its old pool
	// closed with the old snapshot.
	cfg3 := &config.Config{
		Listeners: []config.Listener{httpListener("web", toCluster("/", "a"))},
		Clusters:  []config.Cluster{cluster("a", aAddr)},
	}
	cfg3.Clusters[0].ConnectTimeout = dur(3 * time.Second)
	cfg3.SetDefaults()
	snap3, err := BuildSnapshotFrom(cfg3, Identity{}, 1, snap2)
	if err != nil {
		t.Fatal(err)
	}
	if snap3.SharesCluster(snap2, "a") {
		t.Fatal("a cluster whose spec changed was carried over")
	}
	m.Publish(snap3)
	if _, body := get(t, c, base+"/"); body != "a" {
		t.Fatalf("after the change: body %q", body)
	}
	if n := aConns.Load(); n != 2 {
		t.Fatalf("after cluster a changed: backend a saw %d connections, want 2 (a new pool)", n)
	}
}
