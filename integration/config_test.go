package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// validConfig is a config that both validate and serve accept; bad configs
// are this with one thing broken. ADMIN, WEB and BACKEND are placeholders.
const validConfig = `
[server]
concurrency = 2
drain_time = "5s"

[admin]
address = "ADMIN"

[[listeners]]
name = "web"
address = "WEB"
protocol = "http"

  [[listeners.routes]]
  prefix = "/"
  cluster = "backend"

[[clusters]]
name = "backend"
lb_policy = "round_robin"
endpoints = ["BACKEND"]
`

func fillConfig(t *testing.T, cfg string) string {
	return strings.NewReplacer(
		"ADMIN", harness.FreeAddr(t),
		"WEB", harness.FreeAddr(t),
		"BACKEND", harness.ClosedAddr(t),
	).Replace(cfg)
}

// TestBadConfigRejected checks that every broken config is refused by
// `validate` and by `serve` (which must exit non-zero, not serve), with a
// message naming the file, the key and the value at fault.
func TestBadConfigRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(string) string
		want []string // substrings of stderr, besides the file name
	}{
		{"unknown key", func(s string) string {
			return strings.Replace(s, "concurrency = 2", "concurrency = 2\nconcurency = 2", 1)
		}, []string{"concurency"}},
		{"wrong type", func(s string) string {
			return strings.Replace(s, "concurrency = 2", `concurrency = "two"`, 1)
		}, []string{"server.concurrency", "two"}},
		{"bad duration", func(s string) string {
			return strings.Replace(s, `drain_time = "5s"`, `drain_time = "5 parsecs"`, 1)
		}, []string{"server.drain_time", "5 parsecs"}},
		{"duplicate listener name", func(s string) string {
			return s + "\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:1\"\nprotocol = \"tcp\"\ncluster = \"backend\"\n"
		}, []string{`listeners[1] ("web").name`, "duplicate"}},
		{"duplicate cluster name", func(s string) string {
			return s + "\n[[clusters]]\nname = \"backend\"\nendpoints = [\"127.0.0.1:2\"]\n"
		}, []string{`clusters[1] ("backend").name`, "duplicate"}},
		{"route to unknown cluster", func(s string) string {
			return strings.Replace(s, `cluster = "backend"`, `cluster = "nosuch"`, 1)
		}, []string{`listeners[0] ("web").routes[0].cluster`, "nosuch"}},
		{"unparsable address", func(s string) string {
			return strings.Replace(s, `address = "WEB"`, `address = "127.0.0.1:notaport"`, 1)
		}, []string{`listeners[0] ("web").address`, "notaport"}},
		{"no endpoints", func(s string) string {
			i := strings.Index(s, "endpoints = [")
			return s[:i] + "endpoints = []\n"
		}, []string{`clusters[0] ("backend").endpoints`}},
		// Issue 8, item 10: values that validated and broke at run time.
		{"admin on all addresses", func(s string) string {
			return strings.Replace(s, `address = "ADMIN"`, `address = "0.0.0.0:1"`, 1)
		}, []string{"admin.address", `"0.0.0.0:1"`, "allow_remote = true"}},
		{"flush_interval of a nanosecond", func(s string) string {
			return s + "\n[stats]\nflush_interval = \"1ns\"\n"
		}, []string{"stats.flush_interval", `"1ns"`, "between 10ms and 5m"}},
		{"max_header_bytes near 2^63", func(s string) string {
			return strings.Replace(s, `protocol = "http"`, "protocol = \"http\"\nmax_header_bytes = 9223372036854775000", 1)
		}, []string{`listeners[0] ("web").max_header_bytes`, "9223372036854775000", "between 1024 and 1048576"}},
		{"write_timeout of a nanosecond", func(s string) string {
			return strings.Replace(s, `protocol = "http"`, "protocol = \"http\"\nwrite_timeout = \"1ns\"", 1)
		}, []string{`listeners[0] ("web").write_timeout`, `"1ns"`, "between 10ms and 24h"}},
		{"unresolvable endpoint", func(s string) string {
			i := strings.Index(s, "endpoints = [")
			return s[:i] + "endpoints = [\"nosuch.onion:80\"]\n"
			// Resolution is part of the build, not of the config's
			// validation: its message names the cluster and the
			// endpoint in words, not by key path.
		}, []string{`"backend"`, "nosuch.onion:80"}},
		// Failures of the build after the config checks: serve and
		// validate run the same one (server.Prepare).
		{"access log in a missing directory", func(s string) string {
			return strings.Replace(s, `protocol = "http"`, "protocol = \"http\"\naccess_log = [{ path = \"/nonexistent-dir-of-hotproxy/access.log\" }]", 1)
		}, []string{"access_log 0", "/nonexistent-dir-of-hotproxy", "create it first"}},
		{"certificate file missing", func(s string) string {
			return strings.Replace(s, `protocol = "http"`, "protocol = \"http\"\ntls = { certificates = [{ cert = \"/nonexistent-dir-of-hotproxy/a.pem\", key = \"/nonexistent-dir-of-hotproxy/a.key\" }] }", 1)
		}, []string{"/nonexistent-dir-of-hotproxy/a.pem"}},
		// Issue 23: the [xds] table names a static cluster of the file.
		{"xds control plane not a cluster", func(s string) string {
			return s + "\n[xds]\ncluster = \"control_plane\"\n"
		}, []string{"xds.cluster", `"control_plane"`, "no such cluster", `"backend"`}},
		{"xds protocol unknown", func(s string) string {
			return s + "\n[xds]\ncluster = \"backend\"\nprotocol = \"rest\"\n"
		}, []string{"xds.protocol", `"rest"`, "delta or sotw"}},
	}
	// The base config is valid: the table tests what it thinks it tests.
	t.Run("valid base", func(t *testing.T) {
		path := harness.WriteConfig(t, fillConfig(t, validConfig+"\n[xds]\ncluster = \"backend\"\nnode_id = \"n1\"\nprotocol = \"sotw\"\n"))
		if r := harness.Run(t, "validate", "-c", path); r.Code != 0 {
			t.Fatalf("validate of the base config with [xds]: exit %d\n%s", r.Code, r.Stderr)
		}
	})
	t.Run("valid base without xds", func(t *testing.T) {
		path := harness.WriteConfig(t, fillConfig(t, validConfig))
		if r := harness.Run(t, "validate", "-c", path); r.Code != 0 {
			t.Fatalf("validate of the base config: exit %d\n%s", r.Code, r.Stderr)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := fillConfig(t, tc.edit(validConfig))
			path := harness.WriteConfig(t, cfg)

			r := harness.Run(t, "validate", "-c", path)
			if r.Code == 0 {
				t.Errorf("validate: exit 0 for a bad config\nstdout: %s\nconfig:\n%s", r.Stdout, cfg)
			} else {
				wantContains(t, "validate's stderr", r.Stderr, append([]string{path}, tc.want...)...)
			}

			p := harness.LaunchFile(t, path, harness.LaunchOptions{Args: []string{"--base-id", strconv.Itoa(harness.UniqueBaseID())}})
			code, err := p.Wait(15 * time.Second)
			if err != nil {
				t.Fatalf("serve did not exit for a bad config: %v\n%s", err, p.Output())
			}
			if code == 0 {
				t.Errorf("serve: exit 0 for a bad config\n%s", p.Output())
			} else {
				wantContains(t, "serve's stderr", p.Stderr(), append([]string{p.ConfigPath}, tc.want...)...)
			}
			sameRefusal(t, r.Stderr, p.Stderr())
		})
	}
}

// sameRefusal checks that serve refused a config with the message
// validate gave for it (each after its verb: "hotproxy validate: ",
// "hotproxy serve: "), whole: a config that validates starts, and one
// that fails at start fails validate, in the same words.
func sameRefusal(t *testing.T, validateStderr, serveStderr string) {
	t.Helper()
	v, ok := strings.CutPrefix(strings.TrimSpace(validateStderr), "hotproxy validate: ")
	if !ok {
		t.Errorf("validate's stderr does not start with \"hotproxy validate: \":\n%s", validateStderr)
		return
	}
	i := strings.Index(serveStderr, "hotproxy serve: ")
	if i < 0 {
		t.Errorf("serve's stderr has no \"hotproxy serve: \" line:\n%s", serveStderr)
		return
	}
	if sv := strings.TrimSpace(serveStderr[i+len("hotproxy serve: "):]); sv != v {
		t.Errorf("serve and validate refuse the config in other words:\nvalidate: %s\nserve:    %s", v, sv)
	}
}

// TestValidateAndServeAgreeOnGoldenConfigs runs validate and serve on every
// bad config of config's golden tests (config/testdata/*.toml): both
// refuse it, with the same message.
func TestValidateAndServeAgreeOnGoldenConfigs(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "config", "testdata", "*.toml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("golden configs: %v %v", files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			path := harness.WriteConfig(t, string(data))
			r := harness.Run(t, "validate", "-c", path)
			if r.Code == 0 {
				t.Fatalf("validate: exit 0 for %s", file)
			}
			p := harness.LaunchFile(t, path, harness.LaunchOptions{Args: []string{"--base-id", strconv.Itoa(harness.UniqueBaseID())}})
			code, err := p.Wait(15 * time.Second)
			if err != nil || code == 0 {
				t.Fatalf("serve: exit %d, %v for %s\n%s", code, err, file, p.Output())
			}
			sameRefusal(t, r.Stderr, p.Stderr())
		})
	}
}

// TestBindFailureNamesListener starts a proxy whose listener address is
// held by another socket: serve exits non-zero naming the listener and the
// address; validate (which binds nothing) accepts the config.
func TestBindFailureNamesListener(t *testing.T) {
	t.Parallel()
	held := harness.HoldPort(t)
	cfg := harness.Config{
		Concurrency: testConcurrency,
		Listeners: []harness.Listener{{
			Name: "taken", Address: held,
			Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "x"}},
		}},
	}.Allocate(t).TOML()
	path := harness.WriteConfig(t, cfg)
	if r := harness.Run(t, "validate", "-c", path); r.Code != 0 {
		t.Errorf("validate binds nothing and should accept the config: exit %d\n%s", r.Code, r.Stderr)
	}
	p := harness.Launch(t, cfg)
	code, err := p.Wait(15 * time.Second)
	if err != nil {
		t.Fatalf("serve did not exit on a bind failure: %v\n%s", err, p.Output())
	}
	if code == 0 {
		t.Fatalf("serve: exit 0 on a bind failure\n%s", p.Output())
	}
	wantContains(t, "serve's stderr", p.Stderr(), "taken", held)
	if !strings.Contains(strings.ToLower(p.Stderr()), "in use") {
		t.Errorf("serve's stderr does not say the address is in use:\n%s", p.Stderr())
	}
	// Issue 15: each error once, not once as a log line and again as text.
	// (Counted by the address, which a log line's quoting leaves as is.)
	if n := strings.Count(p.Stderr(), held); n != 1 {
		t.Errorf("serve's stderr says the error %d times, want once:\n%s", n, p.Stderr())
	}

	// With [log] path, stderr still says it once, and the log file too.
	logPath := filepath.Join(t.TempDir(), "hotproxy.log")
	p = harness.Launch(t, cfg+"\n[log]\npath = \""+logPath+"\"\n")
	if code, err := p.Wait(15 * time.Second); err != nil || code == 0 {
		t.Fatalf("serve with [log] path: exit %d, %v\n%s", code, err, p.Output())
	}
	if n := strings.Count(p.Stderr(), held); n != 1 {
		t.Errorf("with [log] path, serve's stderr says the error %d times, want once:\n%s", n, p.Stderr())
	}
	logged, _ := os.ReadFile(logPath)
	if n := strings.Count(string(logged), held); n != 1 {
		t.Errorf("the log file says the error %d times, want once:\n%s", n, logged)
	}
}

// TestVersion checks that `version` runs and names the hot-restart
// protocol.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := harness.Run(t, "version")
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "hotproxy ") {
		t.Fatalf("version: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	t.Log(strings.TrimSpace(r.Stdout))
	if r := harness.Run(t, "nosuchverb"); r.Code == 0 {
		t.Errorf("unknown verb: exit 0")
	}
}

// TestValidateAndServeAgreeOnBadConfigs runs validate and serve on every
// config of config's bad-config tables (TestBadConfigs,
// TestRoutingKeysRefused, TestResilienceInvalid, which write them out
// when HOTPROXY_DUMP_BAD_CONFIGS names a directory): both refuse each,
// with the same message. (TestTLSConfigProblems' rows name files in its
// own temporary directory, gone once it ends.)
func TestValidateAndServeAgreeOnBadConfigs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command("go", "test", "-count=1", "-run", "^(TestBadConfigs|TestRoutingKeysRefused|TestResilienceInvalid)$", "./config")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "HOTPROXY_DUMP_BAD_CONFIGS="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test ./config (the bad-config tables): %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.toml"))
	for _, table := range []string{"bad", "routing", "resilience"} {
		if rows, _ := filepath.Glob(filepath.Join(dir, table+"-*.toml")); len(rows) < 10 {
			t.Fatalf("only %d configs of the %s table written: the dump is broken", len(rows), table)
		}
	}
	if len(files) < 50 {
		t.Fatalf("only %d bad configs written: the dump is broken", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			r := harness.Run(t, "validate", "-c", path)
			if r.Code == 0 {
				data, _ := os.ReadFile(path)
				t.Fatalf("validate: exit 0 for a bad config:\n%s", data)
			}
			p := harness.LaunchFile(t, path, harness.LaunchOptions{Args: []string{"--base-id", strconv.Itoa(harness.UniqueBaseID())}})
			code, err := p.Wait(15 * time.Second)
			if err != nil || code == 0 {
				t.Fatalf("serve: exit %d, %v\n%s", code, err, p.Output())
			}
			sameRefusal(t, r.Stderr, p.Stderr())
		})
	}
}
