package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// Issue 23 end to end: hotproxy following the demo control plane
// (cmd/hotproxy-controlplane, go-control-plane's snapshot cache and
// server, built by the test) over ADS, SotW and delta, with real backends
// and steady load that must see no failed request.

// xdsWaitTimeout bounds each wait for a change to reach the workers.
const xdsWaitTimeout = 15 * time.Second

var controlPlaneBuild struct {
	once sync.Once
	path string
	dir  string // removed by removeControlPlaneBinary
	err  error
}

// removeControlPlaneBinary removes what controlPlaneBinary built, at the
// end of the test process.
func removeControlPlaneBinary() {
	if controlPlaneBuild.dir != "" {
		os.RemoveAll(controlPlaneBuild.dir)
	}
}

// controlPlaneBinary builds cmd/hotproxy-controlplane once per test process.
func controlPlaneBinary(t testing.TB) string {
	t.Helper()
	controlPlaneBuild.once.Do(func() {
		root, err := harness.ModuleRoot()
		if err != nil {
			controlPlaneBuild.err = err
			return
		}
		dir, err := os.MkdirTemp("", "hotproxy-controlplane-")
		if err != nil {
			controlPlaneBuild.err = err
			return
		}
		controlPlaneBuild.dir = dir
		path := filepath.Join(dir, "hotproxy-controlplane")
		ctx, cancel := context.WithTimeout(context.Background(), harness.DefaultBuildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", path, "./cmd/hotproxy-controlplane")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			controlPlaneBuild.err = fmt.Errorf("go build ./cmd/hotproxy-controlplane: %w\n%s", err, out)
			return
		}
		controlPlaneBuild.path = path
	})
	if controlPlaneBuild.err != nil {
		t.Fatal(controlPlaneBuild.err)
	}
	return controlPlaneBuild.path
}

// xdsSnapshot is what the test serves, in the demo control plane's file
// format (Envoy's JSON per resource).
type xdsSnapshot struct {
	// Listeners: name → address; each uses the route configuration of
	// the same name (RDS).
	Listeners map[string]string
	// Routes: listener name → prefix → cluster, most specific first.
	Routes map[string][][2]string
	// Clusters: name → endpoints (EDS).
	Clusters map[string][]string
	// Extra is added to the cluster named by its key, as JSON fields.
	Extra map[string]map[string]any
	// RawRoutes: listener name → Envoy's JSON of its routes, used
	// instead of Routes[name] when set (header matches, splits).
	RawRoutes map[string][]any
	// Secrets: name → certificate and key PEM (SDS). A listener whose
	// name is a secret's serves TLS with it.
	Secrets map[string][2]string
}

func (s xdsSnapshot) clone() xdsSnapshot {
	c := xdsSnapshot{Listeners: map[string]string{}, Routes: map[string][][2]string{}, Clusters: map[string][]string{},
		Extra: map[string]map[string]any{}, Secrets: map[string][2]string{}}
	for k, v := range s.Secrets {
		c.Secrets[k] = v
	}
	for k, v := range s.Listeners {
		c.Listeners[k] = v
	}
	for k, v := range s.Routes {
		c.Routes[k] = append([][2]string(nil), v...)
	}
	for k, v := range s.Clusters {
		c.Clusters[k] = append([]string(nil), v...)
	}
	for k, v := range s.Extra {
		c.Extra[k] = v
	}
	return c
}

func socketAddress(t testing.TB, addr string) map[string]any {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var p int
	fmt.Sscan(port, &p)
	return map[string]any{"socket_address": map[string]any{"address": host, "port_value": p}}
}

func (s xdsSnapshot) json(t testing.TB, version int) []byte {
	ads := map[string]any{"ads": map[string]any{}, "resource_api_version": "V3"}
	var listeners, routes, clusters, endpoints, secrets []any
	for name, pair := range s.Secrets {
		secrets = append(secrets, map[string]any{"name": name, "tls_certificate": map[string]any{
			"certificate_chain": map[string]any{"inline_string": pair[0]},
			"private_key":       map[string]any{"inline_string": pair[1]},
		}})
	}
	for name, addr := range s.Listeners {
		chain := map[string]any{}
		if _, ok := s.Secrets[name]; ok {
			chain["transport_socket"] = map[string]any{"name": "envoy.transport_sockets.tls", "typed_config": map[string]any{
				"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
				"common_tls_context": map[string]any{"tls_certificate_sds_secret_configs": []any{
					map[string]any{"name": name, "sds_config": ads}}},
			}}
		}
		listeners = append(listeners, map[string]any{
			"name":    name,
			"address": socketAddress(t, addr),
			"filter_chains": []any{withFields(chain, map[string]any{"filters": []any{map[string]any{
				"name": "envoy.filters.network.http_connection_manager",
				"typed_config": map[string]any{
					"@type":       "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
					"stat_prefix": name,
					"rds":         map[string]any{"route_config_name": name, "config_source": ads},
					"http_filters": []any{map[string]any{"name": "envoy.filters.http.router",
						"typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}},
				},
			}}})},
		})
	}
	routeNames := map[string]bool{}
	for name := range s.Routes {
		routeNames[name] = true
	}
	for name := range s.RawRoutes {
		routeNames[name] = true
	}
	for name := range routeNames {
		list := s.RawRoutes[name]
		if list == nil {
			for _, r := range s.Routes[name] {
				list = append(list, map[string]any{"match": map[string]any{"prefix": r[0]}, "route": map[string]any{"cluster": r[1]}})
			}
		}
		routes = append(routes, map[string]any{"name": name,
			"virtual_hosts": []any{map[string]any{"name": "all", "domains": []string{"*"}, "routes": list}}})
	}
	for name, eps := range s.Clusters {
		c := map[string]any{"name": name, "type": "EDS", "eds_cluster_config": map[string]any{"eds_config": ads},
			"connect_timeout": "1s", "lb_policy": "ROUND_ROBIN"}
		for k, v := range s.Extra[name] {
			c[k] = v
		}
		clusters = append(clusters, c)
		var lbs []any
		for _, ep := range eps {
			lbs = append(lbs, map[string]any{"endpoint": map[string]any{"address": socketAddress(t, ep)}})
		}
		endpoints = append(endpoints, map[string]any{"cluster_name": name, "endpoints": []any{map[string]any{"lb_endpoints": lbs}}})
	}
	b, err := json.Marshal(map[string]any{"version": fmt.Sprint(version), "listeners": listeners, "routes": routes,
		"clusters": clusters, "endpoints": endpoints, "secrets": secrets})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func withFields(m map[string]any, more map[string]any) map[string]any {
	for k, v := range more {
		m[k] = v
	}
	return m
}

// demoControlPlane is a running cmd/hotproxy-controlplane serving file.
type demoControlPlane struct {
	t       testing.TB
	addr    string
	file    string
	version int
	cmd     *exec.Cmd
	out     *strings.Builder
	done    chan struct{}
}

func startDemoControlPlane(t testing.TB, snap xdsSnapshot) *demoControlPlane {
	t.Helper()
	cp := &demoControlPlane{t: t, addr: harness.FreeAddr(t), file: filepath.Join(t.TempDir(), "snapshot.json")}
	cp.set(snap)
	cp.start()
	t.Cleanup(cp.stop)
	return cp
}

// set writes snap as the next version, atomically (a rename: the control
// plane never reads half a file).
func (cp *demoControlPlane) set(snap xdsSnapshot) {
	cp.t.Helper()
	cp.version++
	tmp := cp.file + ".tmp"
	if err := os.WriteFile(tmp, snap.json(cp.t, cp.version), 0o644); err != nil {
		cp.t.Fatal(err)
	}
	if err := os.Rename(tmp, cp.file); err != nil {
		cp.t.Fatal(err)
	}
}

func (cp *demoControlPlane) start() {
	cp.t.Helper()
	cp.out = &strings.Builder{}
	cp.cmd = exec.Command(controlPlaneBinary(cp.t), "-file", cp.file, "-listen", cp.addr, "-poll", "100ms")
	cp.cmd.Stdout, cp.cmd.Stderr = cp.out, cp.out
	if err := cp.cmd.Start(); err != nil {
		cp.t.Fatal(err)
	}
	cp.done = make(chan struct{})
	go func() { cp.cmd.Wait(); close(cp.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", cp.addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			cp.t.Fatalf("control plane not listening on %s within 10s: %v", cp.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the control plane (SIGTERM, then SIGKILL), by its pid.
func (cp *demoControlPlane) stop() {
	if cp.cmd == nil || cp.cmd.Process == nil {
		return
	}
	cp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-cp.done:
	case <-time.After(5 * time.Second):
		cp.cmd.Process.Kill()
		<-cp.done
	}
	cp.cmd = nil
}

// xdsProxyConfig is a bootstrap with no listener of its own: everything
// comes from the control plane at cpAddr.
func xdsProxyConfig(protocol, cpAddr string) harness.Config {
	return harness.Config{
		Concurrency: testConcurrency,
		DrainTime:   "3s",
		Extra: fmt.Sprintf("[xds]\ncluster = \"control_plane\"\nnode_id = \"test\"\nprotocol = %q\ninitial_fetch_timeout = \"5s\"\n"+
			"[hot_restart]\ncommit_window = \"1s\"\n"+
			"[[clusters]]\nname = \"control_plane\"\nendpoints = [%q]\nhttp2 = true\nconnect_timeout = \"1s\"\n", protocol, cpAddr),
	}
}

// bodyFrom GETs url and returns the body, or "" with the error.
func bodyFrom(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := ioCopy(&b, resp); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return b.String(), nil
}

// waitBody polls url until its body is want+"\n" (a backend's id).
func waitBody(t testing.TB, c *http.Client, url, want, what string) time.Duration {
	t.Helper()
	return waitBodyWithin(t, c, url, want, what, xdsWaitTimeout)
}

func waitBodyWithin(t testing.TB, c *http.Client, url, want, what string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	var last string
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = bodyFrom(c, url)
		if lastErr == nil && last == want+"\n" {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %s still answers %q (%v) after %s, want %q", what, url, last, lastErr, within, want)
	return 0
}

// waitRefused polls until nothing accepts on addr.
func waitRefused(t testing.TB, addr, what string) {
	t.Helper()
	deadline := time.Now().Add(xdsWaitTimeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: %s still accepts after %s", what, addr, xdsWaitTimeout)
}

// xdsCounter reads a counter of the serving generation.
func xdsCounter(t testing.TB, g *harness.Generation, name string) uint64 {
	t.Helper()
	v, _ := adminStats(t, g).counter(name)
	return v
}

// dynamicClusterNames is what GET /config_dump shows of the dynamic clusters.
func dynamicClusterNames(t testing.TB, g *harness.Generation) []string {
	t.Helper()
	_, body, err := g.AdminDo(http.MethodGet, "/config_dump")
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Dynamic *struct {
			Clusters []struct {
				Name string `json:"name"`
			} `json:"clusters"`
		} `json:"dynamic_resources"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatalf("config_dump: %v: %.300s", err, body)
	}
	var names []string
	if dump.Dynamic != nil {
		for _, c := range dump.Dynamic.Clusters {
			names = append(names, c.Name)
		}
	}
	return names
}

// TestXDSFollowsTheControlPlane runs, for each protocol, one control
// plane and one hotproxy chain through every kind of change, under steady
// keep-alive load on the first dynamic listener that must see no failed
// request: endpoints moved, a route and a cluster added, changed and
// removed, a listener added, changed and removed, a cluster with an
// unsupported field and one whose name clashes with a static one NACKed
// (the previous configuration serving on), the control plane stopped and
// restarted, and a hot restart while it is down (the child serves the
// handed-over resources and resumes the stream once it is back).
func TestXDSFollowsTheControlPlane(t *testing.T) {
	for _, protocol := range []string{"delta", "sotw"} {
		t.Run(protocol, func(t *testing.T) { testXDSFollows(t, protocol) })
	}
}

func testXDSFollows(t *testing.T, protocol string) {
	a := harness.StartHTTPBackend(t, "A")
	b := harness.StartHTTPBackend(t, "B")
	c := harness.StartHTTPBackend(t, "C")
	webAddr := harness.FreeAddr(t)
	snap := xdsSnapshot{
		Listeners: map[string]string{"web": webAddr},
		Routes:    map[string][][2]string{"web": {{"/", "app"}}},
		Clusters:  map[string][]string{"app": {a.Addr}},
		Extra:     map[string]map[string]any{},
		Secrets:   map[string][2]string{},
	}
	cp := startDemoControlPlane(t, snap)

	ch := &chain{t: t, baseID: newBaseID()}
	tbl, path := statsTable(t)
	ch.statsPath = path
	cfg := xdsProxyConfig(protocol, cp.addr)
	cfg.Extra += "\n" + tbl
	ch.cfgPath = writeConfigFile(t, cfg.Allocate(t).TOML())
	g := ch.launch(0, harness.LaunchOptions{})
	if err := g.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("epoch 0: %v\n%s", err, g.Output())
	}
	ch.serving = g
	// Ready means the first set serves (no initial_fetch_timeout here).
	client := newClient(5 * time.Second)
	if body, err := bodyFrom(client, "http://"+webAddr+"/"); err != nil || body != "A\n" {
		t.Fatalf("at ready, the dynamic listener answers %q, %v; want A\n%s", body, err, g.Output())
	}

	load := startSteadyLoad(t, loadgen.Options{
		URL: "http://" + webAddr + "/load", Mode: loadgen.KeepAlive, Clients: 4, Rate: 100,
		Check: func(_ *http.Response, body []byte) error {
			switch string(body) {
			case "A\n", "B\n", "C\n":
				return nil
			}
			return fmt.Errorf("body %q is no backend's", body)
		},
	})
	load.WaitMore(t, 50)
	web := "http://" + webAddr

	t.Run("endpoints moved", func(t *testing.T) {
		snap.Clusters["app"] = []string{b.Addr}
		cp.set(snap)
		waitBody(t, client, web+"/", "B", "endpoints A → B")
		load.WaitMore(t, 50)
	})
	t.Run("route and cluster added, changed, removed", func(t *testing.T) {
		snap.Clusters["extra"] = []string{c.Addr}
		snap.Routes["web"] = [][2]string{{"/extra/", "extra"}, {"/", "app"}}
		cp.set(snap)
		waitBody(t, client, web+"/extra/x", "C", "route /extra/ → new cluster extra")
		snap.Routes["web"] = [][2]string{{"/extra/", "app"}, {"/", "app"}}
		cp.set(snap)
		waitBody(t, client, web+"/extra/x", "B", "route /extra/ changed to app")
		delete(snap.Clusters, "extra")
		snap.Routes["web"] = [][2]string{{"/", "app"}}
		cp.set(snap)
		deadline := time.Now().Add(xdsWaitTimeout)
		for names := dynamicClusterNames(t, g); len(names) != 1 || names[0] != "app"; names = dynamicClusterNames(t, g) {
			if time.Now().After(deadline) {
				t.Fatalf("cluster extra removed: config_dump still shows %v", names)
			}
			time.Sleep(20 * time.Millisecond)
		}
		load.WaitMore(t, 50)
	})
	t.Run("listener added, changed, removed", func(t *testing.T) {
		// A change to listener "second" touches only it: web's
		// keep-alive clients keep the connections they dialled first,
		// never told to close (issue 23), across all of it.
		const keptClients = 2
		kept, err := loadgen.Start(context.Background(), loadgen.Options{
			URL: web + "/kept", Mode: loadgen.KeepAlive, Clients: keptClients, Rate: 50, Duration: 2 * time.Minute,
			Check: func(_ *http.Response, body []byte) error {
				if string(body) != "B\n" {
					return fmt.Errorf("body %q, want B", body)
				}
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer kept.Stop()
		if !kept.WaitTotal(20, xdsWaitTimeout) {
			t.Fatalf("web's keep-alive load did not start: %v", kept.Snapshot())
		}
		addr2, addr3 := harness.FreeAddr(t), harness.FreeAddr(t)
		snap.Listeners["second"] = addr2
		snap.Routes["second"] = [][2]string{{"/", "extra2"}}
		snap.Clusters["extra2"] = []string{c.Addr}
		cp.set(snap)
		waitBody(t, client, "http://"+addr2+"/", "C", "listener second added")

		// Changed on the same address: it terminates TLS now (SDS).
		ca := harness.NewCA(t, "xds listener change CA")
		cert, key := ca.Issue(t, "second", "127.0.0.1").PEM(t)
		snap.Secrets["second"] = [2]string{string(cert), string(key)}
		cp.set(snap)
		tlsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}, DisableKeepAlives: true}}
		waitBody(t, tlsClient, "https://"+addr2+"/", "C", "listener second changed to TLS on the same address")

		snap.Listeners["second"] = addr3 // its address changed: a new socket, the old one drained
		cp.set(snap)
		waitBody(t, tlsClient, "https://"+addr3+"/", "C", "listener second moved")
		waitRefused(t, addr2, "listener second's old address")
		delete(snap.Listeners, "second")
		delete(snap.Routes, "second")
		delete(snap.Clusters, "extra2")
		delete(snap.Secrets, "second")
		cp.set(snap)
		waitRefused(t, addr3, "listener second removed")
		// Past what a drain of web would take to close an idle
		// keep-alive connection (drainIdleGrace, 1s): nothing.
		time.Sleep(1500 * time.Millisecond)
		res := kept.Stop()
		if res.Failed() != 0 || res.OK() == 0 {
			t.Fatalf("web's keep-alive load while second changed: %v\nproxy log:\n%s", res, g.Stderr())
		}
		if res.Conns != keptClients {
			t.Fatalf("web's %d keep-alive clients dialled %d connections while listener second was added, changed and removed, want %d: a change to one listener closed another's connections (%v)",
				keptClients, res.Conns, keptClients, res)
		}
		t.Logf("web, kept: %v", res)
		load.WaitMore(t, 50)
	})
	t.Run("certificate rotated by SDS", func(t *testing.T) {
		ca := harness.NewCA(t, "xds test CA")
		first := ca.Issue(t, "sds", "127.0.0.1")
		tlsAddr := harness.FreeAddr(t)
		cert, key := first.PEM(t)
		snap.Secrets["secure"] = [2]string{string(cert), string(key)}
		snap.Listeners["secure"] = tlsAddr
		snap.Routes["secure"] = [][2]string{{"/", "app"}}
		cp.set(snap)
		serialSeen := func() string {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
			if err != nil {
				return "error: " + err.Error()
			}
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
		}
		waitSerial := func(want, what string) {
			t.Helper()
			deadline := time.Now().Add(xdsWaitTimeout)
			got := serialSeen()
			for ; got != want; got = serialSeen() {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the TLS listener shows serial %s, want %s", what, got, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		waitSerial(first.Leaf.SerialNumber.String(), "listener secure added with its SDS certificate")
		second := ca.Reissue(t, "sds", first)
		cert, key = second.PEM(t)
		snap.Secrets["secure"] = [2]string{string(cert), string(key)}
		cp.set(snap)
		waitSerial(second.Leaf.SerialNumber.String(), "certificate rotated by SDS")
		delete(snap.Secrets, "secure")
		delete(snap.Listeners, "secure")
		delete(snap.Routes, "secure")
		cp.set(snap)
		waitRefused(t, tlsAddr, "TLS listener removed")
		load.WaitMore(t, 50)
	})
	t.Run("NACK", func(t *testing.T) {
		for _, tc := range []struct {
			name, want string
			bad        func(s *xdsSnapshot)
			stat       string
		}{
			{"unsupported field", `field "lb_subset_config" is not supported by hotproxy`, func(s *xdsSnapshot) {
				s.Extra["app"] = map[string]any{"lb_subset_config": map[string]any{"fallback_policy": "ANY_ENDPOINT"}}
			}, "xds.clusters.update_rejected"},
			{"name of a static cluster", `dynamic cluster "control_plane": the name of static clusters[0]`, func(s *xdsSnapshot) {
				s.Clusters["control_plane"] = []string{a.Addr}
			}, "xds.clusters.update_rejected"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := xdsCounter(t, g, tc.stat)
				bad := snap.clone()
				tc.bad(&bad)
				cp.set(bad)
				deadline := time.Now().Add(xdsWaitTimeout)
				// hclog quotes the error: its quotes are escaped in the log.
				logged := func() bool { return strings.Contains(strings.ReplaceAll(g.Stderr(), `\"`, `"`), tc.want) }
				for xdsCounter(t, g, tc.stat) == before || !logged() {
					if time.Now().After(deadline) {
						t.Fatalf("no NACK within %s: %s %d (was %d); log:\n%s", xdsWaitTimeout, tc.stat, xdsCounter(t, g, tc.stat), before, g.Stderr())
					}
					time.Sleep(20 * time.Millisecond)
				}
				// The previous configuration serves on: B, not A.
				for range 20 {
					if body, err := bodyFrom(client, web+"/"); err != nil || body != "B\n" {
						t.Fatalf("after the NACK: %q, %v; want the previous configuration's B", body, err)
					}
				}
				cp.set(snap)
			})
		}
		// A good set after the refused ones is applied.
		snap.Clusters["app"] = []string{c.Addr}
		cp.set(snap)
		waitBody(t, client, web+"/", "C", "endpoints after the NACKs")
		load.WaitMore(t, 50)
	})
	t.Run("control plane stopped and restarted", func(t *testing.T) {
		cp.stop()
		load.WaitMore(t, 50) // serving on without it
		snap.Clusters["app"] = []string{a.Addr}
		cp.set(snap)
		cp.start()
		waitBody(t, client, web+"/", "A", "a change made while the control plane was down, once it is back")
		load.WaitMore(t, 50)
	})
	t.Run("hot restart with the control plane down", func(t *testing.T) {
		cp.stop()
		child, parent := ch.restart()
		g = child
		if !strings.Contains(child.Stderr(), "took over the xDS resources of the previous generation") {
			t.Fatalf("the child did not take the xDS resources over:\n%s", child.Stderr())
		}
		waitExit0(t, parent, 20*time.Second)
		for range 20 {
			if body, err := bodyFrom(client, web+"/"); err != nil || body != "A\n" {
				t.Fatalf("the child answers %q, %v; want the handed-over A", body, err)
			}
		}
		// The gauges show the handed-over versions (nothing counted).
		if _, stats := child.AdminGet("/stats?filter=xds.clusters.version_hash"); !strings.Contains(string(stats), "xds.clusters.version_hash: ") ||
			strings.Contains(string(stats), "xds.clusters.version_hash: 0\n") {
			t.Errorf("the child's xds.clusters.version_hash is not the handed-over version's: %q", stats)
		}
		if names := dynamicClusterNames(t, child); len(names) != 1 || names[0] != "app" {
			t.Fatalf("the child's config_dump shows dynamic clusters %v, want [app]", names)
		}
		load.WaitMore(t, 50)
		// The control plane back: the child's stream resumes and follows.
		snap.Clusters["app"] = []string{b.Addr}
		cp.set(snap)
		cp.start()
		waitBody(t, client, web+"/", "B", "the child following the control plane once it is back")
		load.WaitMore(t, 50)
	})

	res := load.Stop()
	if res.Failed() != 0 || res.OK() == 0 {
		t.Fatalf("load over every change: %v\nproxy log:\n%s", res, g.Stderr())
	}
	t.Logf("%s: %v", protocol, res)
}

// TestXDSStartWithoutControlPlane: with the control plane unreachable, a
// generation serves its file's listener at once, reports ready only once
// initial_fetch_timeout has passed (saying why in its log), and applies
// the dynamic configuration when the control plane comes.
func TestXDSStartWithoutControlPlane(t *testing.T) {
	backend := harness.StartHTTPBackend(t, "A")
	cpAddr := harness.FreeAddr(t)
	webAddr := harness.FreeAddr(t)
	cfg := httpProxyConfig(backend.Addr)
	cfg.Extra = fmt.Sprintf("[xds]\ncluster = \"control_plane\"\nprotocol = \"delta\"\ninitial_fetch_timeout = \"1s\"\n"+
		"[[clusters]]\nname = \"control_plane\"\nendpoints = [%q]\nhttp2 = true\n", cpAddr)
	tbl, _ := statsTable(t)
	cfg.Extra += "\n" + tbl
	ch := &chain{t: t, baseID: newBaseID(), cfgPath: writeConfigFile(t, cfg.Allocate(t).TOML())}
	g := ch.launch(0, harness.LaunchOptions{})
	if err := g.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("%v\n%s", err, g.Output())
	}
	if waited := g.ReadyAt().Sub(g.Exec); waited < time.Second {
		t.Errorf("ready %v after exec, before initial_fetch_timeout (1s)", waited)
	}
	// The log line is written before READY; its pipe is read apart.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(g.Stderr(), "initial_fetch_timeout: no configuration from the control plane yet; serving the static part") {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say it serves the static part:\n%s", g.Stderr())
		}
		time.Sleep(10 * time.Millisecond)
	}
	client := newClient(5 * time.Second)
	if body, err := bodyFrom(client, g.URL("web", "/")); err != nil || body != "A\n" {
		t.Fatalf("the file's listener answers %q, %v", body, err)
	}
	// A hot restart while the control plane has never answered: nothing
	// to hand over; the child waits for it as a cold start does, then
	// takes over, and the parent drains and exits.
	ch.serving = g
	child, parent := ch.restart()
	waitExit0(t, parent, 20*time.Second)
	if body, err := bodyFrom(client, child.URL("web", "/")); err != nil || body != "A\n" {
		t.Fatalf("the child's file listener answers %q, %v", body, err)
	}
	// The control plane comes: its listener is added.
	cp := &demoControlPlane{t: t, addr: cpAddr, file: filepath.Join(t.TempDir(), "snapshot.json")}
	cp.set(xdsSnapshot{Listeners: map[string]string{"dyn": webAddr}, Routes: map[string][][2]string{"dyn": {{"/", "app"}}},
		Clusters: map[string][]string{"app": {backend.Addr}}})
	cp.start()
	t.Cleanup(cp.stop)
	// The client has been failing to connect since the start: its
	// back-off (full jitter, up to 30s) bounds when it tries again.
	waitBodyWithin(t, client, "http://"+webAddr+"/", "A", "the dynamic listener, once the control plane is up", 40*time.Second)
}
