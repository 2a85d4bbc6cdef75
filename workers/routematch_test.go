package workers

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/route"
)

// fakeFields is a request's fields as route.RequestFields reads them.
type fakeFields [][2]string

func (f fakeFields) RequestField(name string, n int) (string, bool) {
	for _, kv := range f {
		if kv[0] == name {
			if n == 0 {
				return kv[1], true
			}
			n--
		}
	}
	return "", false
}

func exact(s string) *string { return &s }

// headerRoutesConfig routes by header fields to two real backends, "a"
// and "b", and answers "fallback" itself when no route matches.
func headerRoutesConfig(t *testing.T) *config.Config {
	a, b := namedBackend(t, "a", 200, nil), namedBackend(t, "b", 200, nil)
	lst := httpListener("web",
		config.Route{Prefix: "/", Headers: []config.HeaderMatch{{Name: "X-Canary", Exact: exact("on")}}, Cluster: "a"},
		config.Route{Prefix: "/", Headers: []config.HeaderMatch{{Name: ":method", Exact: exact("POST")}}, Cluster: "b"},
		config.Route{Prefix: "/inv", Headers: []config.HeaderMatch{{Name: "x-env", Prefix: "prod", Invert: true}}, Cluster: "a"},
		config.Route{Prefix: "/multi", Headers: []config.HeaderMatch{{Name: "x-tag", Exact: exact("1,2")}}, Cluster: "b"},
		config.Route{Prefix: "/p", Headers: []config.HeaderMatch{{Name: "x-user", Present: true}, {Name: ":method", Prefix: "GE"}}, Cluster: "a"},
		config.Route{Prefix: "/p", Headers: []config.HeaderMatch{{Name: "x-user", Present: true, Invert: true}}, Cluster: "b"},
		config.Route{Prefix: "/ic", Headers: []config.HeaderMatch{{Name: "x-canary", Exact: exact("yes"), IgnoreCase: true}}, Cluster: "a"},
		config.Route{Prefix: "/host", Headers: []config.HeaderMatch{{Name: "Host", Prefix: "127.0.0.1:"}}, Cluster: "b"},
		config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "fallback"}},
	)
	return &config.Config{Listeners: []config.Listener{lst}, Clusters: []config.Cluster{cluster("a", a), cluster("b", b)}}
}

// headerCases are requests and the answer their header fields route to.
var headerCases = []struct {
	name, method, path string
	header             http.Header
	want               string
}{
	{"exact", "GET", "/", http.Header{"X-Canary": {"on"}}, "a"},
	{"exact, other case of the value", "GET", "/", http.Header{"X-Canary": {"ON"}}, "fallback"},
	{"exact, other value", "GET", "/", http.Header{"X-Canary": {"off"}}, "fallback"},
	{"no field", "GET", "/", nil, "fallback"},
	{":method", "POST", "/", nil, "b"},
	{":method, exact first", "POST", "/", http.Header{"X-Canary": {"on"}}, "a"},
	{"invert, other value", "GET", "/inv", http.Header{"X-Env": {"staging"}}, "a"},
	{"invert, the prefix", "GET", "/inv", http.Header{"X-Env": {"production"}}, "fallback"},
	{"invert, absent (as Envoy)", "GET", "/inv", nil, "fallback"},
	{"two fields joined", "GET", "/multi", http.Header{"X-Tag": {"1", "2"}}, "b"},
	{"one of two fields", "GET", "/multi", http.Header{"X-Tag": {"1"}}, "fallback"},
	{"present and :method prefix", "GET", "/p", http.Header{"X-User": {""}}, "a"},
	{"present, :method no", "DELETE", "/p", http.Header{"X-User": {"u"}}, "fallback"},
	{"present inverted", "DELETE", "/p", nil, "b"},
	{"ignore_case", "GET", "/ic", http.Header{"X-Canary": {"YeS"}}, "a"},
	{"host: the Host field, or :authority", "GET", "/host", nil, "b"},
}

// TestRouteHeaderMatchHTTP1 and TestRouteHeaderMatchH2C: the same
// requests over HTTP/1.1 and HTTP/2 reach the same backend by their
// header fields and method.
func TestRouteHeaderMatchHTTP1(t *testing.T) {
	m := startManager(t, headerRoutesConfig(t), 2)
	c := newClient(t)
	for _, hc := range headerCases {
		req := newReq(t, hc.method, "http://"+addr(t, m, "web")+hc.path, nil)
		req.Header = hc.header.Clone()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", hc.name, err)
		}
		b := make([]byte, 64)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b[:n]) != hc.want {
			t.Errorf("%s: %s %s %v: %d %q, want %q", hc.name, hc.method, hc.path, hc.header, resp.StatusCode, b[:n], hc.want)
		}
	}
}

func TestRouteHeaderMatchH2C(t *testing.T) {
	cfg := headerRoutesConfig(t)
	h2cListener(&cfg.Listeners[0])
	m := startManager(t, cfg, 2)
	c := h2cClient(t)
	for _, hc := range headerCases {
		req := newReq(t, hc.method, "http://"+addr(t, m, "web")+hc.path, nil)
		req.Header = hc.header.Clone()
		resp, body := h2Do(t, c, req)
		if resp.StatusCode != 200 || body != hc.want {
			t.Errorf("%s: %s %s %v: %d %q, want %q", hc.name, hc.method, hc.path, hc.header, resp.StatusCode, body, hc.want)
		}
	}
}

// TestWeightedSplit: a 3:1 split over real backends. N requests each go
// to "a" with p = 3/4: the count is binomial, mean 3N/4, sd
// sqrt(N p (1-p)) (8.7 for N = 400); 5 sd either way fails a correct
// split with probability under 1e-6. Over HTTP/1.1 and HTTP/2, the
// clusters' stats and the access log name the cluster that served each
// request.
func TestWeightedSplit(t *testing.T) {
	for _, major := range []int{1, 2} {
		t.Run(fmt.Sprintf("HTTP/%d", major), func(t *testing.T) {
			var gotA, gotB atomic.Int64
			a, b := namedBackend(t, "a", 200, &gotA), namedBackend(t, "b", 200, &gotB)
			path := filepath.Join(t.TempDir(), "access.log")
			lst := httpListener("web", config.Route{Prefix: "/", WeightedClusters: []config.WeightedCluster{{Cluster: "a", Weight: 3}, {Cluster: "b", Weight: 1}}})
			lst.AccessLog = []config.AccessLog{{Path: path, Format: "%UPSTREAM_CLUSTER% %UPSTREAM_HOST%"}}
			c := newClient(t)
			if major == 2 {
				h2cListener(&lst)
				c = h2cClient(t)
			}
			cfg := &config.Config{Listeners: []config.Listener{lst}, Clusters: []config.Cluster{cluster("a", a), cluster("b", b)}}
			m := startManager(t, cfg, 2)
			const n = 400
			served := map[string]int{}
			for i := range n {
				resp, body := get(t, c, fmt.Sprintf("http://%s/r%d", addr(t, m, "web"), i))
				if resp.StatusCode != 200 || resp.ProtoMajor != major {
					t.Fatalf("request %d: %s %d", i, resp.Proto, resp.StatusCode)
				}
				served[body]++
			}
			p := 3.0 / 4
			mean, sd := n*p, math.Sqrt(n*p*(1-p))
			if na := float64(served["a"]); math.Abs(na-mean) > 5*sd || served["a"]+served["b"] != n {
				t.Errorf("served %v: a got %v, want %v ± %.0f (5 sd)", served, na, mean, 5*sd)
			}
			if int(gotA.Load()) != served["a"] || int(gotB.Load()) != served["b"] {
				t.Errorf("backends counted a %d, b %d; answers said %v", gotA.Load(), gotB.Load(), served)
			}
			for _, name := range []string{"a", "b"} {
				if got := counter(m, "cluster."+name+".upstream_rq_total"); got != uint64(served[name]) {
					t.Errorf("cluster.%s.upstream_rq_total = %d, want %d (what it served)", name, got, served[name])
				}
			}
			m.Close() // writes out the access log's queue
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			logged := map[string]int{}
			for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
				cl, host, _ := strings.Cut(line, " ")
				if want := map[string]string{"a": a, "b": b}[cl]; host != want {
					t.Fatalf("access log line %q: cluster %q with upstream host %q, want %q", line, cl, host, want)
				}
				logged[cl]++
			}
			if logged["a"] != served["a"] || logged["b"] != served["b"] {
				t.Errorf("access log counts %v, served %v", logged, served)
			}
		})
	}
}

// TestRouteMatchAllocs: matching a route with header matches, and
// picking from a weighted split, allocate nothing.
func TestRouteMatchAllocs(t *testing.T) {
	cfg := headerRoutesConfig(t)
	cfg.Listeners[0].Routes = append([]config.Route{{Prefix: "/split", WeightedClusters: []config.WeightedCluster{{Cluster: "a", Weight: 3}, {Cluster: "b", Weight: 1}}}}, cfg.Listeners[0].Routes...)
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	ls := snap.listeners["web"]
	var f route.RequestFields = fakeFields{{"x-tag", "1"}, {"x-tag", "2"}, {":method", "GET"}}
	var picked [2]int
	allocs := testing.AllocsPerRun(1000, func() {
		if r := ls.routes.Match("h", "/multi", "", f); r == nil || r.Cluster != "b" {
			t.Fatalf("/multi routed to %+v", r)
		}
		r := ls.routes.Match("h", "/split", "", f)
		picked[r.Index-len(ls.routes)]++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per match", allocs)
	}
	if picked[0] == 0 || picked[1] == 0 {
		t.Errorf("split picks %v: one cluster never picked", picked)
	}
}

// splitConfig routes requests with :method GET and an X-Canary field
// (or, over HTTP/2, without one: the raw client sends none) 1:1 over
// two clusters of backend, after a route whose header match fails.
func splitConfig(backend string, h2c bool) *config.Config {
	canary := config.HeaderMatch{Name: "x-canary", Present: true, Invert: h2c}
	lst := httpListener("web",
		config.Route{Prefix: "/", Headers: []config.HeaderMatch{{Name: ":method", Exact: exact("DELETE")}}, Cluster: "a"},
		config.Route{Prefix: "/", Headers: []config.HeaderMatch{{Name: ":method", Exact: exact("GET")}, canary},
			WeightedClusters: []config.WeightedCluster{{Cluster: "a", Weight: 1}, {Cluster: "b", Weight: 1}}})
	lst.HTTP2Cleartext = h2c
	return &config.Config{Listeners: []config.Listener{lst}, Clusters: []config.Cluster{cluster("a", backend), cluster("b", backend)}}
}

// BenchmarkH1ProxyHeaderMatchSplit: BenchmarkH1ProxyKeepAlive through
// header matches and a weighted split (0 allocs/op is the bar).
func BenchmarkH1ProxyHeaderMatchSplit(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, splitConfig(be, false), 1)
	a := addr(b, m, "web")
	req := "GET /bench HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: bench\r\nX-Canary: 1\r\n\r\n"
	benchRaw(b, a, req, probeLen(b, a, req))
	checkSplitServed(b, m)
}

// checkSplitServed fails a benchmark whose requests did not all reach
// the split's two clusters (a 404 would bench the wrong path).
func checkSplitServed(b *testing.B, m *Manager) {
	b.StopTimer()
	na, nb := counter(m, "cluster.a.upstream_rq_total"), counter(m, "cluster.b.upstream_rq_total")
	if na == 0 || nb == 0 || na+nb < uint64(b.N) {
		b.Fatalf("the split's clusters served a %d, b %d of %d requests", na, nb, b.N)
	}
}

// BenchmarkH2CProxyHeaderMatchSplit: BenchmarkH2CProxyRawClient through
// header matches and a weighted split.
func BenchmarkH2CProxyHeaderMatchSplit(b *testing.B) {
	be := rawKeepAliveBackend(b, benchResponse)
	m := startManager(b, splitConfig(be, true), 1)
	bc := newBenchH2Client(b, addr(b, m, "web"), "GET", "/", nil)
	bc.do(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bc.do(b)
	}
	checkSplitServed(b, m)
}

// TestHeaderMatchSplitZeroAllocs: header matches and a weighted split
// keep both front ends' proxied requests at 0 allocations.
func TestHeaderMatchSplitZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own account")
	}
	for name, bench := range map[string]func(*testing.B){
		"HTTP/1.1": BenchmarkH1ProxyHeaderMatchSplit, "HTTP/2": BenchmarkH2CProxyHeaderMatchSplit,
	} {
		r := testing.Benchmark(bench)
		if r.N == 0 {
			t.Fatalf("%s: the benchmark failed", name)
		}
		if a := r.AllocsPerOp(); a != 0 {
			t.Errorf("%s: %d allocs/op (%d B/op) over %d requests, want 0", name, a, r.AllocedBytesPerOp(), r.N)
		}
		t.Logf("%s: %v", name, r)
	}
}
