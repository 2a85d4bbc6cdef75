package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// issueConfig is the config of the original design issue; it must stay valid.
const issueConfig = `
[server]
concurrency = 2            # workers; 0 = one per CPU this process may run on
drain_time = "30s"
parent_shutdown_time = "45s"

[admin]
address = "127.0.0.1:9901"

[[listeners]]
name = "web"
address = "127.0.0.1:8080"
protocol = "http"

  [[listeners.routes]]
  prefix = "/healthz"
  direct_response = { status = 200, body = "ok" }

  [[listeners.routes]]
  prefix = "/"
  cluster = "backend"

[[listeners]]
name = "db"
address = "127.0.0.1:15432"
protocol = "tcp"
cluster = "pg"

[[clusters]]
name = "backend"
lb_policy = "round_robin"     # also least_request, random
endpoints = ["127.0.0.1:9000", "127.0.0.1:9001"]
connect_timeout = "1s"

[[clusters]]
name = "pg"
endpoints = ["127.0.0.1:5432"]
`

const examplePath = "../examples/hotproxy.toml"

func mustParse(tb testing.TB, data, source string) *Config {
	tb.Helper()
	c, err := Parse([]byte(data), source)
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	return c
}

func TestIssueConfig(t *testing.T) {
	c := mustParse(t, issueConfig, "hotproxy.toml")
	want := &Config{
		Server:     Server{Concurrency: 2, DrainTime: Duration(30 * time.Second), ParentShutdownTime: Duration(45 * time.Second), ReusePort: ptr(true), TimerSlack: Duration(time.Millisecond)},
		Admin:      Admin{Address: "127.0.0.1:9901"},
		Log:        Log{Level: "info", Format: "text"},
		HotRestart: HotRestart{CommitWindow: Duration(DefaultCommitWindow), HandoffTimeout: Duration(DefaultHandoffTimeout), MaxDrainingGenerations: DefaultMaxDrainingGenerations, KeepListeners: ptr(true)},
		Stats:      Stats{FileMode: DefaultStatsFileMode, FlushInterval: Duration(DefaultStatsFlushInterval)},
		Watchdog:   Watchdog{MissTimeout: Duration(200 * time.Millisecond), MegaMissTimeout: Duration(time.Second), SupervisorTimeout: Duration(30 * time.Second)},
		Overload: Overload{Interval: Duration(250 * time.Millisecond), RetryAfter: Duration(5 * time.Second), ResetPerPass: 16,
			ResetMinBusy: Duration(5 * time.Second), MemoryLimitPercent: 80, TimeoutMinPercent: 10},
		XDS: XDS{Protocol: XDSProtocolDelta, InitialFetchTimeout: Duration(DefaultInitialFetchTimeout),
			Resources: []string{XDSListeners, XDSRoutes, XDSClusters, XDSEndpoints, XDSSecrets}},
		Listeners: []Listener{
			{
				Name: "web", Address: "127.0.0.1:8080", Protocol: ProtocolHTTP,
				Routes: []Route{
					{Prefix: "/healthz", DirectResponse: &DirectResponse{Status: 200, Body: "ok", ContentType: "text/plain; charset=utf-8"}},
					{Prefix: "/", Cluster: "backend"},
				},
				IdleTimeout:         Duration(DefaultHTTPIdleTimeout),
				RequestTimeout:      Duration(DefaultRequestTimeout),
				HeaderTimeout:       Duration(DefaultHeaderTimeout),
				MaxHeaderBytes:      DefaultMaxHeaderBytes,
				WriteTimeout:        Duration(DefaultWriteTimeout),
				TrustForwardedFor:   ptr(true),
				Balance:             DefaultBalance,
				ParkIdleConnections: ptr(true),
			},
			{
				Name: "db", Address: "127.0.0.1:15432", Protocol: ProtocolTCP, Cluster: "pg",
				IdleTimeout: Duration(DefaultTCPIdleTimeout), Balance: DefaultBalance,
			},
		},
		Clusters: []Cluster{
			{
				Name: "backend", LBPolicy: LBRoundRobin, Endpoints: []string{"127.0.0.1:9000", "127.0.0.1:9001"},
				ConnectTimeout: Duration(time.Second), IdleTimeout: Duration(DefaultUpstreamIdle), MaxIdlePerEndpoint: new(DefaultMaxIdlePerEndpoint), DNSRefresh: Duration(DefaultDNSRefresh),
			},
			{
				Name: "pg", LBPolicy: LBRoundRobin, Endpoints: []string{"127.0.0.1:5432"},
				ConnectTimeout: Duration(DefaultConnectTimeout), IdleTimeout: Duration(DefaultUpstreamIdle), MaxIdlePerEndpoint: new(DefaultMaxIdlePerEndpoint), DNSRefresh: Duration(DefaultDNSRefresh),
			},
		},
		Source: "hotproxy.toml",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got\n%+v\nwant\n%+v", c, want)
	}
	if !c.Server.ReusePortEnabled() {
		t.Error("reuse_port left out should mean enabled")
	}
}

func TestLoadDefault(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != "<embedded default>" {
		t.Errorf("Source = %q", c.Source)
	}
	if c.Admin.Address != "127.0.0.1:9901" || c.Server.Concurrency != 0 {
		t.Errorf("admin %q, concurrency %d", c.Admin.Address, c.Server.Concurrency)
	}
	l := c.Listener("default")
	if l == nil || l.Address != "127.0.0.1:10000" || l.Protocol != ProtocolHTTP || len(l.Routes) != 1 {
		t.Fatalf("listener default = %+v", l)
	}
	r := l.Routes[0]
	if r.Prefix != "/" || r.DirectResponse == nil || r.DirectResponse.Status != 200 ||
		r.DirectResponse.Body != "hotproxy %VERSION% epoch %EPOCH% pid %PID%\n" {
		t.Errorf("route = %+v, %+v", r, r.DirectResponse)
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hotproxy.toml")
	if err := os.WriteFile(path, []byte(issueConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != path {
		t.Errorf("Source = %q, want %q", c.Source, path)
	}

	if err := os.WriteFile(path, []byte("[server]\nconcurrency = -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+": server.concurrency: -1") {
		t.Errorf("error %q should start with the path, the key and the value", err)
	}

	missing := filepath.Join(t.TempDir(), "nope.toml")
	_, err = Load(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if errors.Is(err, ErrInvalid) {
		t.Error("a missing file is not an invalid config")
	}
}

func TestExampleIsValid(t *testing.T) {
	c, err := Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	// The issue config's listeners and clusters are all there.
	issue := mustParse(t, issueConfig, examplePath)
	for _, l := range issue.Listeners {
		got := c.Listener(l.Name)
		if got == nil || got.Address != l.Address || got.Protocol != l.Protocol || got.Cluster != l.Cluster {
			t.Errorf("example: listener %q = %+v, want like %+v", l.Name, got, l)
		}
	}
	for _, cl := range issue.Clusters {
		if got := c.Cluster(cl.Name); got == nil || !reflect.DeepEqual(got.Endpoints, cl.Endpoints) {
			t.Errorf("example: cluster %q = %+v, want like %+v", cl.Name, got, cl)
		}
	}
}

// TestExampleHasEveryKey keeps examples/hotproxy.toml from rotting: every
// key of the schema (the toml tags in config.go) is set in it, and named
// in one of its comments.
func TestExampleHasEveryKey(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	var walk func(m map[string]any, prefix string)
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			set[prefix+k] = true
			if sub, ok := v.(map[string]any); ok {
				walk(sub, prefix+k+".")
			}
			if l, ok := tableList(v); ok {
				for _, e := range l {
					if sub, ok := e.(map[string]any); ok {
						walk(sub, prefix+k+".")
					}
				}
			}
		}
	}
	walk(raw, "")

	var comments strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		if _, c, ok := strings.Cut(line, "#"); ok {
			comments.WriteString(c + "\n")
		}
	}
	keys := schemaKeys()
	if len(keys) < 30 {
		t.Fatalf("schema has only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !set[k] {
			t.Errorf("examples/hotproxy.toml does not set %s", k)
		}
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !strings.Contains(comments.String(), leaf) {
			t.Errorf("examples/hotproxy.toml does not explain %s in a comment", k)
		}
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, `
[[listeners]]
name = "h"
address = ":8080"
protocol = "http"
routes = [{ prefix = "/", cluster = "c" }]

[[listeners]]
name = "t"
address = ":0"
protocol = "tcp"
cluster = "c"

[[clusters]]
name = "c"
endpoints = ["backend.internal:9000"]
`, "d.toml")
	checks := []struct {
		name      string
		got, want any
	}{
		{"drain_time", c.Server.DrainTime.D(), DefaultDrainTime},
		{"parent_shutdown_time", c.Server.ParentShutdownTime.D(), DefaultParentShutdownTime},
		{"concurrency", c.Server.Concurrency, 0},
		{"reuse_port", c.Server.ReusePortEnabled(), true},
		{"reuse_port filled in", c.Server.ReusePort != nil && *c.Server.ReusePort, true},
		{"admin.address", c.Admin.Address, DefaultAdminAddress},
		{"log.level", c.Log.Level, DefaultLogLevel},
		{"log.format", c.Log.Format, DefaultLogFormat},
		{"stats.path", c.Stats.Path, ""},
		{"stats.file_mode", c.Stats.FileMode, DefaultStatsFileMode},
		{"stats.file_mode parsed", c.Stats.Mode(), os.FileMode(0o640)},
		{"stats.flush_interval", c.Stats.FlushInterval.D(), DefaultStatsFlushInterval},
		{"http idle_timeout", c.Listeners[0].IdleTimeout.D(), DefaultHTTPIdleTimeout},
		{"http request_timeout", c.Listeners[0].RequestTimeout.D(), DefaultRequestTimeout},
		{"http header_timeout", c.Listeners[0].HeaderTimeout.D(), DefaultHeaderTimeout},
		{"http max_header_bytes", c.Listeners[0].MaxHeaderBytes, DefaultMaxHeaderBytes},
		{"http write_timeout", c.Listeners[0].WriteTimeout.D(), DefaultWriteTimeout},
		{"http trust_forwarded_for set", c.Listeners[0].TrustForwardedFor != nil, true},
		{"http trust_forwarded_for", c.Listeners[0].TrustsForwardedFor(), true},
		{"http max_connections", c.Listeners[0].MaxConnections, 0},
		{"tcp max_connections", c.Listeners[1].MaxConnections, 0},
		{"server max_connections", c.Server.MaxConnections, 0},
		{"http balance", c.Listeners[0].Balance, BalanceLeastConn},
		{"tcp balance", c.Listeners[1].Balance, BalanceLeastConn},
		{"admin allow_remote", c.Admin.AllowRemote, false},
		{"tcp idle_timeout", c.Listeners[1].IdleTimeout.D(), DefaultTCPIdleTimeout},
		{"tcp request_timeout", c.Listeners[1].RequestTimeout.D(), time.Duration(0)},
		{"tcp header_timeout", c.Listeners[1].HeaderTimeout.D(), time.Duration(0)},
		{"tcp max_header_bytes", c.Listeners[1].MaxHeaderBytes, 0},
		{"tcp write_timeout", c.Listeners[1].WriteTimeout.D(), time.Duration(0)},
		{"tcp trust_forwarded_for left unset", c.Listeners[1].TrustForwardedFor == nil, true},
		{"lb_policy", c.Clusters[0].LBPolicy, LBRoundRobin},
		{"connect_timeout", c.Clusters[0].ConnectTimeout.D(), DefaultConnectTimeout},
		{"cluster idle_timeout", c.Clusters[0].IdleTimeout.D(), DefaultUpstreamIdle},
		{"max_idle_per_endpoint", *c.Clusters[0].MaxIdlePerEndpoint, DefaultMaxIdlePerEndpoint},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	if DefaultDrainTime != 30*time.Second || DefaultParentShutdownTime != 45*time.Second || DefaultAdminAddress != "127.0.0.1:9901" || DefaultWriteTimeout != 60*time.Second {
		t.Error("the documented defaults changed; update examples/hotproxy.toml too")
	}

	// A longer drain_time alone stretches the default parent_shutdown_time.
	c = mustParse(t, "[server]\ndrain_time = \"2m\"\n", "d.toml")
	if got := c.Server.ParentShutdownTime.D(); got != 3*time.Minute {
		t.Errorf("parent_shutdown_time with drain_time 2m = %v, want 3m", got)
	}
	// An explicit 0 is kept where it means something.
	c = mustParse(t, "[[clusters]]\nname = \"c\"\nendpoints = [\"a:1\"]\nmax_idle_per_endpoint = 0\n", "d.toml")
	if got := c.Clusters[0].MaxIdlePerEndpoint; got == nil || *got != 0 {
		t.Errorf("max_idle_per_endpoint = 0 became %v", got)
	}
	// Written values are kept, an explicit false among them.
	c = mustParse(t, webOK+"trust_forwarded_for = false\nwrite_timeout = \"5s\"\nmax_connections = 100\n"+clusterC+
		"[server]\nmax_connections = 5000\n", "d.toml")
	if l := c.Listeners[0]; l.TrustsForwardedFor() || l.TrustForwardedFor == nil || l.WriteTimeout.D() != 5*time.Second || l.MaxConnections != 100 {
		t.Errorf("written values changed: trust_forwarded_for %v, write_timeout %v, max_connections %d", l.TrustForwardedFor, l.WriteTimeout.D(), l.MaxConnections)
	}
	if c.Server.MaxConnections != 5000 {
		t.Errorf("server.max_connections = 5000 became %d", c.Server.MaxConnections)
	}

	// SetDefaults, for configs built in code, gives the same result.
	built := &Config{
		Listeners: []Listener{{Name: "h", Address: ":8080", Protocol: ProtocolHTTP, Routes: []Route{{Prefix: "/", Cluster: "c"}}}, {Name: "t", Address: ":0", Protocol: ProtocolTCP, Cluster: "c"}},
		Clusters:  []Cluster{{Name: "c", Endpoints: []string{"backend.internal:9000"}}},
		Source:    "d.toml",
	}
	built.SetDefaults()
	if err := built.Validate(); err != nil {
		t.Fatal(err)
	}
	parsed := mustParse(t, `
[[listeners]]
name = "h"
address = ":8080"
protocol = "http"
routes = [{ prefix = "/", cluster = "c" }]
[[listeners]]
name = "t"
address = ":0"
protocol = "tcp"
cluster = "c"
[[clusters]]
name = "c"
endpoints = ["backend.internal:9000"]
`, "d.toml")
	if !reflect.DeepEqual(built, parsed) {
		t.Errorf("SetDefaults:\n%+v\nParse:\n%+v", built, parsed)
	}
}

func TestDurationJSON(t *testing.T) {
	b, err := json.Marshal(Server{DrainTime: Duration(90 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"drain_time":"1m30s"`) {
		t.Errorf("json = %s, want drain_time as a string", b)
	}
	var s Server
	if err := json.Unmarshal(b, &s); err != nil || s.DrainTime.D() != 90*time.Second {
		t.Errorf("round trip: %v, %v", s.DrainTime.D(), err)
	}
	c := mustParse(t, issueConfig, "hotproxy.toml")
	if _, err := json.Marshal(c); err != nil {
		t.Errorf("config_dump: %v", err)
	}
}

func TestErrorType(t *testing.T) {
	_, err := Parse([]byte("[server]\nconcurrency = -1\n[log]\nlevel = \"loud\"\n"), "x.toml")
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
	}
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 2 || e.Source != "x.toml" {
		t.Fatalf("errors.As: %#v", err)
	}
	if e.Problems[0].Key != "server.concurrency" || e.Problems[1].Key != "log.level" {
		t.Errorf("keys: %q, %q", e.Problems[0].Key, e.Problems[1].Key)
	}
	if lines := strings.Split(err.Error(), "\n"); len(lines) != 2 {
		t.Errorf("want one line per problem, got %q", err.Error())
	}
	if err := (&Config{}).Validate(); err == nil {
		t.Error("Validate of a zero Config (no defaults) should fail")
	}

	_, err = Parse([]byte("[server]\nconcurrency = 1\nconcurrency = 2\n"), "x.toml")
	if !errors.As(err, &e) || e.Problems[0].Line != 3 || e.Problems[0].Column == 0 {
		t.Errorf("syntax error position: %#v", err)
	}
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

func ptr[T any](v T) *T { return &v }
