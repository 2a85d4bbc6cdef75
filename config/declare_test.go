package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestDefaultConstantsAreTheDeclaredOnes: the exported Default constants
// name the defaults declared on the fields, for documentation and other
// packages; they cannot drift from them.
func TestDefaultConstantsAreTheDeclaredOnes(t *testing.T) {
	for path, want := range map[string]any{
		"server.drain_time":                                      Duration(DefaultDrainTime),
		"admin.address":                                          DefaultAdminAddress,
		"log.level":                                              DefaultLogLevel,
		"log.format":                                             DefaultLogFormat,
		"hot_restart.commit_window":                              Duration(DefaultCommitWindow),
		"hot_restart.handoff_timeout":                            Duration(DefaultHandoffTimeout),
		"hot_restart.max_draining_generations":                   DefaultMaxDrainingGenerations,
		"stats.file_mode":                                        DefaultStatsFileMode,
		"stats.flush_interval":                                   Duration(DefaultStatsFlushInterval),
		"listeners.request_timeout":                              Duration(DefaultRequestTimeout),
		"listeners.header_timeout":                               Duration(DefaultHeaderTimeout),
		"listeners.max_header_bytes":                             DefaultMaxHeaderBytes,
		"listeners.write_timeout":                                Duration(DefaultWriteTimeout),
		"listeners.balance":                                      DefaultBalance,
		"listeners.access_log.format":                            DefaultAccessLogFormat,
		"listeners.access_log.queue_size":                        DefaultAccessLogQueue,
		"listeners.tls.min_version":                              DefaultTLSMinVersion,
		"listeners.tls.max_version":                              DefaultTLSMaxVersion,
		"listeners.tls.session_ticket_rotation":                  Duration(DefaultSessionTicketRotation),
		"listeners.tls.handshake_timeout":                        Duration(DefaultHandshakeTimeout),
		"clusters.lb_policy":                                     LBRoundRobin,
		"clusters.connect_timeout":                               Duration(DefaultConnectTimeout),
		"clusters.idle_timeout":                                  Duration(DefaultUpstreamIdle),
		"clusters.max_idle_per_endpoint":                         DefaultMaxIdlePerEndpoint,
		"clusters.dns_refresh":                                   Duration(DefaultDNSRefresh),
		"clusters.health_check.expected_statuses":                []int{DefaultExpectedStatus},
		"clusters.health_check.interval":                         Duration(DefaultHealthCheckInterval),
		"clusters.health_check.timeout":                          Duration(DefaultHealthCheckTimeout),
		"clusters.health_check.unhealthy_threshold":              DefaultUnhealthyThreshold,
		"clusters.health_check.healthy_threshold":                DefaultHealthyThreshold,
		"clusters.outlier_detection.consecutive_5xx":             DefaultConsecutive5xx,
		"clusters.outlier_detection.consecutive_connect_failure": DefaultConsecutiveConnectFailure,
		"clusters.outlier_detection.base_ejection_time":          Duration(DefaultBaseEjectionTime),
		"clusters.outlier_detection.max_ejection_percent":        DefaultMaxEjectionPercent,
		"clusters.circuit_breakers.max_connections":              DefaultCircuitBreakerMaxConnection,
		"clusters.circuit_breakers.max_pending_requests":         DefaultCircuitBreakerMaxPending,
		"clusters.circuit_breakers.max_requests":                 DefaultCircuitBreakerMaxRequests,
		"clusters.circuit_breakers.max_retries":                  DefaultCircuitBreakerMaxRetries,
		"clusters.tls.min_version":                               DefaultTLSMinVersion,
	} {
		f := lookupField(path)
		if f == nil || !f.hasDef {
			t.Errorf("%s declares no default", path)
			continue
		}
		if got := reflect.Indirect(f.def).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: declared default %v, constant %v", path, got, want)
		}
	}
	if lookupField("server.reuse_port").def.Elem().Bool() != true {
		t.Error("server.reuse_port: default is not true")
	}
}

// TestExplicitZeroInCode: a config built in code tells an explicit 0 from
// a key left out, like a file does (SetDefaults turned
// max_idle_per_endpoint = 0 into 64).
func TestExplicitZeroInCode(t *testing.T) {
	t.Run("num_retries", func(t *testing.T) {
		c := &Config{
			Listeners: []Listener{{Name: "h", Address: ":8080", Protocol: ProtocolHTTP, Routes: []Route{
				{Prefix: "/a", Cluster: "c", RetryOn: []string{Retry5xx}, NumRetries: new(0)},
				{Prefix: "/", Cluster: "c", RetryOn: []string{Retry5xx}}}}},
			Clusters: []Cluster{{Name: "c", Endpoints: []string{"a:1"}}},
		}
		c.SetDefaults()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if r := c.Listeners[0].Routes; *r[0].NumRetries != 0 || *r[1].NumRetries != DefaultNumRetries {
			t.Errorf("num_retries: explicit 0 became %d, left out became %d (want 0 and %d)", *r[0].NumRetries, *r[1].NumRetries, DefaultNumRetries)
		}
	})
	zero := func() *int { return new(0) }
	built := &Config{
		Listeners: []Listener{{Name: "h", Address: ":8080", Protocol: ProtocolHTTP, Routes: []Route{{Prefix: "/", Cluster: "c"}}}},
		Clusters: []Cluster{
			{Name: "c", Endpoints: []string{"a:1"}, MaxIdlePerEndpoint: zero(),
				OutlierDetection: &OutlierDetection{Consecutive5xx: zero(), ConsecutiveConnectFailure: zero(), MaxEjectionPercent: zero()},
				CircuitBreakers:  &CircuitBreakers{MaxRetries: zero()}},
			{Name: "d", Endpoints: []string{"a:1"}, OutlierDetection: &OutlierDetection{}, CircuitBreakers: &CircuitBreakers{}},
		},
		Source: "z.toml",
	}
	built.SetDefaults()
	if err := built.Validate(); err != nil {
		t.Fatal(err)
	}
	c, d := built.Clusters[0], built.Clusters[1]
	for name, got := range map[string]*int{
		"max_idle_per_endpoint": c.MaxIdlePerEndpoint, "consecutive_5xx": c.OutlierDetection.Consecutive5xx,
		"consecutive_connect_failure": c.OutlierDetection.ConsecutiveConnectFailure,
		"max_ejection_percent":        c.OutlierDetection.MaxEjectionPercent, "max_retries": c.CircuitBreakers.MaxRetries,
	} {
		if got == nil || *got != 0 {
			t.Errorf("explicit %s = 0 became %v", name, got)
		}
	}
	if *d.MaxIdlePerEndpoint != DefaultMaxIdlePerEndpoint || *d.OutlierDetection.Consecutive5xx != DefaultConsecutive5xx ||
		*d.CircuitBreakers.MaxRetries != DefaultCircuitBreakerMaxRetries {
		t.Errorf("left out: max_idle_per_endpoint %d, consecutive_5xx %d, max_retries %d, want the defaults",
			*d.MaxIdlePerEndpoint, *d.OutlierDetection.Consecutive5xx, *d.CircuitBreakers.MaxRetries)
	}
	parsed := mustParse(t, `
[[listeners]]
name = "h"
address = ":8080"
protocol = "http"
routes = [{ prefix = "/", cluster = "c" }]
[[clusters]]
name = "c"
endpoints = ["a:1"]
max_idle_per_endpoint = 0
outlier_detection = { consecutive_5xx = 0, consecutive_connect_failure = 0, max_ejection_percent = 0 }
circuit_breakers = { max_retries = 0 }
[[clusters]]
name = "d"
endpoints = ["a:1"]
outlier_detection = {}
circuit_breakers = {}
`, "z.toml")
	if !reflect.DeepEqual(built, parsed) {
		t.Errorf("built in code and parsed differ:\n%+v\n%+v", built.Clusters, parsed.Clusters)
	}
}

// TestNewKeyIsOneDeclaration adds two keys to a copy of this package by
// declaring them on a field of config.go, and nothing else, then checks
// that the copy parses them, gives them their default, bounds them, finds
// typos of them, and fills them in for configs built in code.
func TestNewKeyIsOneDeclaration(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a copy of the package")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the copy with")
	}
	mod := t.TempDir()
	for _, f := range []string{"../go.mod", "../go.sum"} {
		copyFile(t, f, filepath.Join(mod, filepath.Base(f)))
	}
	sources, _ := filepath.Glob("*.go")
	sources = append(sources, "default.toml")
	for _, f := range sources {
		if !strings.HasSuffix(f, "_test.go") {
			copyFile(t, f, filepath.Join(mod, "config", f))
		}
	}
	src := filepath.Join(mod, "config", "config.go")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	anchor := "MaxConnections int `toml:\"max_connections,omitzero\""
	if !strings.Contains(string(data), anchor) {
		t.Fatalf("config.go has no %q to add the keys after", anchor)
	}
	decl := "ProbeWait Duration `toml:\"probe_wait\" json:\"probe_wait\" default:\"7s\" bound:\"1s..1m\"`\n" +
		"\tProbeCount int `toml:\"probe_count\" json:\"probe_count\" default:\"3\" bound:\"1..5\"`\n\t"
	data = []byte(strings.Replace(string(data), anchor, decl+anchor, 1))
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(mod, "probe"), 0o755); err != nil {
		t.Fatal(err)
	}
	prog := `package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/hotproxy/hotproxy/config"
)

func main() {
	fail := func(f string, a ...any) { fmt.Printf(f+"\n", a...); os.Exit(1) }
	c, err := config.Parse(nil, "p.toml")
	if err != nil || c.Server.ProbeWait.D().String() != "7s" || c.Server.ProbeCount != 3 {
		fail("left out: %v %v %v", c, err, err)
	}
	var code config.Config
	code.SetDefaults()
	if code.Server.ProbeWait.D().String() != "7s" || code.Server.ProbeCount != 3 {
		fail("SetDefaults: %v %v", code.Server.ProbeWait, code.Server.ProbeCount)
	}
	c, err = config.Parse([]byte("[server]\nprobe_wait = \"2s\"\nprobe_count = 5\n"), "p.toml")
	if err != nil || c.Server.ProbeWait.D().String() != "2s" || c.Server.ProbeCount != 5 {
		fail("set: %v", err)
	}
	for data, want := range map[string]string{
		"[server]\nprobe_wait = \"2h\"\n":  "p.toml: server.probe_wait: \"2h0m0s\": must be between 1s and 1m (leave it out for the default, 7s) (line 2)",
		"[server]\nprobe_count = 0\n":      "p.toml: server.probe_count: 0: must be between 1 and 5 (leave it out for the default, 3) (line 2)",
		"[server]\nprobe_cont = 2\n":       "did you mean probe_count?",
		"[server]\nprobe_wait = 2\n":       "server.probe_wait: expected a duration string",
	} {
		_, err := config.Parse([]byte(data), "p.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			fail("%q: got %v, want %q", data, err, want)
		}
	}
	fmt.Println("ok")
}
`
	if err := os.WriteFile(filepath.Join(mod, "probe", "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "run", "./probe")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("the copy with two keys declared in config.go alone: %v\n%s", err, out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
