package workers

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/route"
)

func direct(body string) *config.DirectResponse {
	return &config.DirectResponse{Status: 200, Body: body}
}

func TestRouteMatch(t *testing.T) {
	routes := []config.Route{
		{Host: "api.example.com", Path: "/exact", DirectResponse: direct("0")},
		{Host: "API.example.com", Prefix: "/v1/", DirectResponse: direct("1")},
		{Host: "*.example.com", Prefix: "/", DirectResponse: direct("2")},
		{Host: "other.test:8080", Prefix: "/", DirectResponse: direct("3")},
		{Prefix: "/static/", DirectResponse: direct("4")},
		{Path: "/", DirectResponse: direct("5")},
		{Prefix: "/static/late", DirectResponse: direct("6")}, // shadowed by 4
	}
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web", routes...)}}
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	ls := snap.listeners["web"]
	for _, tc := range []struct {
		host, path string
		want       int // route index, -1: none
	}{
		{"api.example.com", "/exact", 0},
		{"API.EXAMPLE.COM:8443", "/exact", 0},
		{"api.example.com.", "/exact", 0},
		{"api.example.com", "/exact/more", 2}, // path is exact; wildcard catches it
		{"api.example.com", "/v1/users", 1},
		{"Api.Example.Com", "/v1/", 1},
		{"a.b.example.com", "/anything", 2},
		{"example.com", "/v1/x", -1}, // the wildcard needs a subdomain
		{"badexample.com", "/", 5},   // no dot: not a subdomain; any-host "/" matches
		{"other.test", "/x", 3},
		{"other.test:9999", "/x", 3},
		{"nothing.test", "/static/a.css", 4},
		{"nothing.test", "/static/late", 4}, // first match wins
		{"", "/", 5},
		{"nothing.test", "/x", -1},
		{"[::1]:80", "/", 5},
	} {
		r := ls.routes.Match(tc.host, tc.path, "", nil)
		got := -1
		if r != nil {
			got = r.Index
		}
		if got != tc.want {
			t.Errorf("host %q path %q: route %d, want %d", tc.host, tc.path, got, tc.want)
		}
	}
}

func TestStripPort(t *testing.T) {
	for in, want := range map[string]string{
		"example.com":      "example.com",
		"example.com:80":   "example.com",
		"example.com.":     "example.com",
		"example.com.:443": "example.com",
		"[::1]:8080":       "::1",
		"[::1]":            "::1",
		"10.0.0.1:1":       "10.0.0.1",
		"":                 "",
	} {
		if got := route.StripPort(in); got != want {
			t.Errorf("stripPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBuildSnapshotErrors: the builder holds a config built in code to
// config's rules, in config's words (it re-checked them in its own).
func TestBuildSnapshotErrors(t *testing.T) {
	good := cluster("backend", "127.0.0.1:1")
	for _, tc := range []struct {
		name string
		cfg  config.Config
		want string
	}{
		{"unknown cluster", config.Config{
			Listeners: []config.Listener{httpListener("web", toCluster("/", "nope"))},
		}, `listeners[0] ("web").routes[0].cluster: "nope": no such cluster`},
		{"no action", config.Config{
			Listeners: []config.Listener{httpListener("web", direct2("/", 200), config.Route{Prefix: "/x"})},
		}, `listeners[0] ("web").routes[1]: needs an action`},
		{"path and prefix", config.Config{
			Listeners: []config.Listener{httpListener("web", config.Route{Path: "/a", Prefix: "/", DirectResponse: direct("")})},
		}, `listeners[0] ("web").routes[0]: has both prefix ("/") and path ("/a")`},
		{"bad wildcard", config.Config{
			Listeners: []config.Listener{httpListener("web", config.Route{Host: "api.*.com", Prefix: "/", DirectResponse: direct("")})},
		}, `listeners[0] ("web").routes[0].host: "api.*.com"`},
		{"tcp without cluster", config.Config{
			Listeners: []config.Listener{tcpListener("db", "")},
		}, `listeners[0] ("db").cluster: missing`},
		{"tcp unknown cluster", config.Config{
			Clusters:  []config.Cluster{good},
			Listeners: []config.Listener{tcpListener("db", "pg")},
		}, `listeners[0] ("db").cluster: "pg": no such cluster`},
		{"bad status", config.Config{
			Listeners: []config.Listener{httpListener("web", direct2("/", 42))},
		}, `listeners[0] ("web").routes[0].direct_response.status: 42: must be between 200 and 599`},
		{"cluster without endpoints", config.Config{
			Clusters: []config.Cluster{{Name: "empty"}},
		}, `clusters[0] ("empty").endpoints: a cluster needs at least one endpoint`},
		{"cluster twice", config.Config{
			Clusters: []config.Cluster{good, good},
		}, `clusters[1] ("backend").name: "backend": duplicate name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SetDefaults()
			_, err := BuildSnapshotN(&tc.cfg, Identity{}, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func direct2(prefix string, status int) config.Route {
	return config.Route{Prefix: prefix, DirectResponse: &config.DirectResponse{Status: status}}
}

func TestBuildSnapshotConcurrency(t *testing.T) {
	cfg := &config.Config{
		Server:   config.Server{Concurrency: 3},
		Clusters: []config.Cluster{cluster("b", "127.0.0.1:1")},
	}
	cfg.SetDefaults()
	snap, err := BuildSnapshot(cfg, Identity{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Workers() != 3 || len(snap.views[2]) != 1 || snap.views[0]["b"] == snap.views[1]["b"] {
		t.Fatalf("want 3 distinct worker views, got %d", snap.Workers())
	}
	if _, err := New(Options{Concurrency: 4}, snap); err == nil {
		t.Fatal("New accepted a snapshot built for fewer workers")
	}
}

func TestDirectResponse(t *testing.T) {
	cfg := &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Path: "/id", DirectResponse: &config.DirectResponse{
			Status: 200, Body: "v=%VERSION% epoch=%EPOCH% pid=%PID% host=%HOSTNAME% %OTHER%"}},
		config.Route{Path: "/json", DirectResponse: &config.DirectResponse{
			Status: 503, Body: `{"ok":false}`, ContentType: "application/json"}},
	)}}
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "1.2.3", Epoch: 7, PID: 4242, Hostname: "box"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Concurrency: 1}, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Start()
	base := "http://" + addr(t, m, "web")
	c := newClient(t)

	resp, body := get(t, c, base+"/id")
	if resp.StatusCode != 200 || body != "v=1.2.3 epoch=7 pid=4242 host=box %OTHER%" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	resp, body = get(t, c, base+"/json")
	if resp.StatusCode != 503 || body != `{"ok":false}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %q %q", resp.StatusCode, body, resp.Header.Get("Content-Type"))
	}
	resp, body = get(t, c, base+"/nothing")
	if resp.StatusCode != http.StatusNotFound || body != httpfront.NoRouteBody+"\n" {
		t.Fatalf("no route: got %d %q", resp.StatusCode, body)
	}
	rq, r2, r4, r5 := lstat(m, statRqTotal), lstat(m, "downstream_rq_2xx"), lstat(m, "downstream_rq_4xx"), lstat(m, "downstream_rq_5xx")
	if rq != 3 || r2 != 1 || r4 != 1 || r5 != 1 || lstat(m, statRxBytes) == 0 || lstat(m, statTxBytes) == 0 {
		t.Fatalf("rq_total %d 2xx %d 4xx %d 5xx %d rx %d tx %d", rq, r2, r4, r5, lstat(m, statRxBytes), lstat(m, statTxBytes))
	}

	// Publish: new requests see the new snapshot.
	cfg2 := &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Path: "/id", DirectResponse: &config.DirectResponse{Status: 200, Body: "second %EPOCH%"}})}}
	cfg2.SetDefaults()
	snap2, err := BuildSnapshotN(cfg2, Identity{Epoch: 8}, 1)
	if err != nil {
		t.Fatal(err)
	}
	m.Publish(snap2)
	if _, body = get(t, c, base+"/id"); body != "second 8" {
		t.Fatalf("after Publish: %q", body)
	}
}

// TestSnapshotOfExample: the example config compiles, its passthrough
// listener without a default cluster included (hotproxy validate builds
// the snapshot too).
func TestSnapshotOfExample(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "examples", "hotproxy.toml"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err != nil {
		t.Fatalf("BuildSnapshotN: %v", err)
	}
	ls := snap.listeners["db-passthrough"]
	if ls == nil || ls.cluster != "" || len(ls.sniRoutes) != 1 || ls.sniRoutes.Match("db.example.com") != 0 || ls.sniRoutes.Match("other.example.com") != -1 {
		t.Fatalf("db-passthrough compiled to %+v", ls)
	}
	if r := snap.listeners["web-tls"].routes[0]; r.ServerName != (route.HostPattern{Kind: route.HostWildcard, Name: ".example.org"}) {
		t.Fatalf("web-tls route 0: server_name compiled to %+v", r.ServerName)
	}
}

// TestCompiledRouteTimeout: a route's timeout is resolved when the
// snapshot is compiled (its own, or its listener's request_timeout), not
// at use time by each of the three exchange loops.
func TestCompiledRouteTimeout(t *testing.T) {
	l := httpListener("web",
		config.Route{Prefix: "/own", Cluster: "b", Timeout: config.Duration(3 * time.Second)},
		config.Route{Prefix: "/", Cluster: "b"})
	l.RequestTimeout = config.Duration(7 * time.Second)
	cfg := &config.Config{Listeners: []config.Listener{l}, Clusters: []config.Cluster{cluster("b", "127.0.0.1:1")}}
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	routes := snap.listeners["web"].routes
	if got := routes[0].Timeout; got != 3*time.Second {
		t.Errorf("route with timeout = 3s: compiled %v", got)
	}
	if got := routes[1].Timeout; got != 7*time.Second {
		t.Errorf("route without timeout on a listener with request_timeout = 7s: compiled %v, want 7s", got)
	}
}

// TestSnapshotIsTheOnlyDoor: the Manager is built from the snapshot alone;
// a config changed after the snapshot was compiled changes nothing.
func TestSnapshotIsTheOnlyDoor(t *testing.T) {
	cfg := directConfig("compiled")
	cfg.Listeners[0].HTTP2Cleartext = true
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	// What a worker reading the raw config after start-up would see.
	cfg.Listeners[0].HTTP2Cleartext = false
	cfg.Listeners[0].MaxHeaderBytes = 1
	m, err := New(Options{Concurrency: 1, Logger: testLogger()}, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Start()
	if !m.listeners[0].http2Cleartext || m.listeners[0].h1.Limits.MaxHeadBytes != config.DefaultMaxHeaderBytes {
		t.Fatalf("the manager took http2_cleartext %v, max_header_bytes %d from the changed config",
			m.listeners[0].http2Cleartext, m.listeners[0].h1.Limits.MaxHeadBytes)
	}
	// Served for real: h2c with prior knowledge still works.
	resp, body := get(t, h2cClient(t), "http://"+addr(t, m, "web")+"/")
	if resp.ProtoMajor != 2 || body != "compiled" {
		t.Fatalf("h2c: HTTP/%d %q, want HTTP/2 \"compiled\"", resp.ProtoMajor, body)
	}
}
