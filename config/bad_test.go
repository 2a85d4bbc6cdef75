package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Pieces of valid config that the bad configs below are built from.
const (
	clusterC = "[[clusters]]\nname = \"c\"\nendpoints = [\"127.0.0.1:9000\"]\n"
	webOK    = "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\n"
)

// listener returns a [[listeners]] table named web with the given body.
func listener(body string) string {
	return "[[listeners]]\nname = \"web\"\n" + body + "\n"
}

// httpWith returns an http listener "web" with one route, written inline.
func httpWith(route string) string {
	return listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\nroutes = ["+route+"]") + clusterC
}

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		name string
		toml string
		// want are substrings of one line of the error: the key path and
		// the value, at least.
		want []string
		// problems is how many problems are expected; 0 means 1.
		problems int
	}{
		// [hot_restart]
		{"relative socket dir", "[hot_restart]\nsocket_dir = \"run/hotproxy\"\n" + webOK + clusterC, []string{`hot_restart.socket_dir`, `"run/hotproxy"`, "absolute"}, 1},
		{"zero commit window", "[hot_restart]\ncommit_window = \"0s\"\n" + webOK + clusterC, []string{`hot_restart.commit_window`, `"0s"`}, 1},
		{"no draining generation", "[hot_restart]\nmax_draining_generations = 0\n" + webOK + clusterC, []string{`hot_restart.max_draining_generations`, "0", "between 1 and 62"}, 1},
		{"too many draining generations", "[hot_restart]\nmax_draining_generations = 63\n" + webOK + clusterC, []string{`hot_restart.max_draining_generations`, "63", "between 1 and 62"}, 1},
		{"negative handoff timeout", "[hot_restart]\nhandoff_timeout = \"-1s\"\n" + webOK + clusterC, []string{`hot_restart.handoff_timeout`, `"-1s"`}, 1},
		// [stats]
		{"relative stats path", "[stats]\npath = \"run/hotproxy.stats\"\n" + webOK + clusterC, []string{`stats.path`, `"run/hotproxy.stats"`, "absolute"}, 1},
		{"stats file mode not octal", "[stats]\nfile_mode = \"0649\"\n" + webOK + clusterC, []string{`stats.file_mode`, `"0649"`, "octal"}, 1},
		{"stats file mode decimal-looking", "[stats]\nfile_mode = \"rw-r-----\"\n" + webOK + clusterC, []string{`stats.file_mode`, `"rw-r-----"`, `"0640"`}, 1},
		{"stats file mode too large", "[stats]\nfile_mode = \"01777\"\n" + webOK + clusterC, []string{`stats.file_mode`, `"01777"`, "0000-0777"}, 1},
		{"stats file mode empty", "[stats]\nfile_mode = \"\"\n" + webOK + clusterC, []string{`stats.file_mode`, `""`}, 1},
		{"zero flush interval", "[stats]\nflush_interval = \"0s\"\n" + webOK + clusterC, []string{`stats.flush_interval`, `"0s"`, "between 10ms and 5m", "default, 1s"}, 1},
		{"negative flush interval", "[stats]\nflush_interval = \"-1s\"\n" + webOK + clusterC, []string{`stats.flush_interval`, `"-1s"`}, 1},
		{"file mode as integer", "[stats]\nfile_mode = 416\n" + webOK + clusterC, []string{`stats.file_mode`, "integer"}, 0},
		// listeners.balance
		{"unknown balance", listener("address = \"127.0.0.1:8080\"\nprotocol = \"http\"\nbalance = \"round_robin\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]") + clusterC, []string{`listeners[0] ("web").balance`, `"round_robin"`, "least_conn, hash or kernel"}, 1},
		// Syntax, unknown keys and types.
		{"syntax error", "[server]\nconcurrency = = 2\n", []string{"line 2, column 15", "syntax error", "concurrency = = 2"}, 0},
		{"escape at end of file", "\"\\", []string{"syntax error", "invalid escape"}, 0}, // toml's ErrorWithPosition panicked here
		{"unknown key, close", webOK + "adress = \"x\"\n" + clusterC, []string{`listeners[0] ("web").adress: unknown key`, "did you mean address?"}, 0},
		{"unknown key, other case", "[server]\nConcurrency = 2\n", []string{`server.Concurrency: unknown key`, "did you mean concurrency?"}, 0},
		{"unknown key, other table", "[server]\nendpoints = [\"a:1\"]\n", []string{`server.endpoints: unknown key`, "[[clusters]]"}, 0},
		{"unknown key, nothing close", "[server]\nfoo = 1\n", []string{`server.foo: unknown key`, "drain_time"}, 0},
		{"unknown table", "[servr]\nconcurrency = 2\n", []string{`servr: unknown key`, "did you mean server?"}, 0},
		{"unknown route key", listener("address = \":80\"\nprotocol = \"http\"\n[[listeners.routes]]\nprefix = \"/\"\ncluster = \"c\"\nmethod = \"GET\"") + clusterC, []string{`listeners[0] ("web").routes[0].method: unknown key`}, 0},
		{"wrong type int", "[server]\nconcurrency = \"two\"\n", []string{"server.concurrency", `expected an integer, got string "two"`}, 0},
		{"wrong type float", "[server]\nconcurrency = 2.5\n", []string{"server.concurrency", "float 2.5"}, 0},
		{"wrong type bool", "[server]\nreuse_port = \"yes\"\n", []string{"server.reuse_port", `string "yes"`}, 0},
		{"wrong type string", listener("address = 8080\nprotocol = \"http\""), []string{`listeners[0] ("web").address`, "expected a string, got integer 8080"}, 0},
		{"endpoints not an array", "[[clusters]]\nname = \"c\"\nendpoints = \"127.0.0.1:9000\"\n", []string{`clusters[0] ("c").endpoints`, `"127.0.0.1:9000"`, `endpoints = ["127.0.0.1:9000"]`}, 0},
		{"endpoint not a string", "[[clusters]]\nname = \"c\"\nendpoints = [9000]\n", []string{`clusters[0] ("c").endpoints[0]`, "integer 9000"}, 0},
		{"listeners single table", "[listeners]\nname = \"web\"\n", []string{"listeners", "single table", "[[listeners]]"}, 0},
		{"routes single table", listener("address = \":80\"\nprotocol = \"http\"\n[listeners.routes]\nprefix = \"/\""), []string{`listeners[0] ("web").routes`, "[[listeners.routes]]"}, 0},
		{"direct_response not a table", httpWith(`{ prefix = "/", direct_response = "ok" }`), []string{`listeners[0] ("web").routes[0].direct_response`, `expected a table, got string "ok"`}, 0},
		{"invalid duration", "[server]\ndrain_time = \"30 seconds\"\n", []string{"server.drain_time", `invalid duration "30 seconds"`, `"500ms"`}, 0},
		{"duration as integer", "[server]\ndrain_time = 30\n", []string{"server.drain_time", "integer 30", `"30s"`}, 0},
		{"type errors all reported", "[server]\nconcurrency = \"two\"\ndrain_time = 5\n[log]\nlevel = 1\n", []string{"log.level", "integer 1"}, 3},

		// [server], [admin], [log].
		{"concurrency negative", "[server]\nconcurrency = -1\n", []string{"server.concurrency", "-1", "between 0 and 1024"}, 0},
		{"concurrency too big", "[server]\nconcurrency = 2000\n", []string{"server.concurrency", "2000", "between 0 and 1024"}, 0},
		{"drain_time zero", "[server]\ndrain_time = \"0s\"\nparent_shutdown_time = \"1s\"\n", []string{"server.drain_time", `"0s"`, "between 100ms and 24h", "default, 30s"}, 0},
		{"drain_time negative", "[server]\ndrain_time = \"-5s\"\n", []string{"server.drain_time", `"-5s"`, "between 100ms and 24h"}, 0},
		{"parent_shutdown_time negative", "[server]\nparent_shutdown_time = \"-1s\"\n", []string{"server.parent_shutdown_time", `"-1s"`}, 0},
		{"parent shorter than drain", "[server]\ndrain_time = \"30s\"\nparent_shutdown_time = \"20s\"\n", []string{"server.parent_shutdown_time", `"20s"`, `drain_time ("30s")`, "cut off"}, 0},
		{"admin bad address", "[admin]\naddress = \"localhost\"\n", []string{"admin.address", `"localhost"`, "host:port"}, 0},
		{"admin empty", "[admin]\naddress = \"\"\n", []string{"admin.address", "missing"}, 0},
		{"admin on a listener", webOK + clusterC + "[admin]\naddress = \"127.0.0.1:8080\"\n", []string{"admin.address", `"127.0.0.1:8080"`, `listeners[0] ("web")`}, 0},
		{"admin on all addresses", "[admin]\naddress = \"0.0.0.0:9901\"\n", []string{"admin.address", `"0.0.0.0:9901"`, "not a loopback address", "allow_remote = true", `"127.0.0.1:9901"`}, 0},
		{"admin empty host", "[admin]\naddress = \":9901\"\n", []string{"admin.address", `":9901"`, "not a loopback address"}, 0},
		{"admin IPv6 any", "[admin]\naddress = \"[::]:9901\"\n", []string{"admin.address", `"[::]:9901"`, "not a loopback address"}, 0},
		{"admin private address", "[admin]\naddress = \"10.0.0.1:9901\"\n", []string{"admin.address", `"10.0.0.1:9901"`, "allow_remote"}, 0},
		{"admin hostname", "[admin]\naddress = \"admin.example.com:9901\"\n", []string{"admin.address", `"admin.example.com:9901"`, "allow_remote"}, 0},
		{"admin allow_remote not a bool", "[admin]\naddress = \"0.0.0.0:9901\"\nallow_remote = \"yes\"\n", []string{"admin.allow_remote", `string "yes"`}, 0},
		{"log level", "[log]\nlevel = \"verbose\"\n", []string{"log.level", `"verbose"`, "trace, debug, info, warn or error"}, 0},
		{"log format", "[log]\nformat = \"xml\"\n", []string{"log.format", `"xml"`, "text or json"}, 0},
		{"log path relative", "[log]\npath = \"hotproxy.log\"\n", []string{"log.path", `"hotproxy.log"`, "absolute path"}, 0},

		// Listeners.
		{"listener name missing", "[[listeners]]\naddress = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\n" + clusterC, []string{"listeners[0].name", "missing"}, 0},
		{"listener name invalid", "[[listeners]]\nname = \"my web\"\naddress = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\n" + clusterC, []string{`listeners[0] ("my web").name`, `"my web"`, "letters"}, 0},
		{"listener name duplicate", webOK + strings.Replace(webOK, "8080", "8081", 1) + clusterC, []string{`listeners[1] ("web").name`, `"web"`, "duplicate", "listeners[0]"}, 0},
		{"protocol missing", listener("address = \":80\"") + clusterC, []string{`listeners[0] ("web").protocol`, "missing", "http or tcp"}, 0},
		{"protocol unknown", listener("address = \":80\"\nprotocol = \"udp\""), []string{`listeners[0] ("web").protocol`, `"udp"`, "http or tcp"}, 0},
		{"address missing", listener("protocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, "missing"}, 0},
		{"address no port", listener("address = \"127.0.0.1\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"127.0.0.1"`, "host:port"}, 0},
		{"address port out of range", listener("address = \"127.0.0.1:99999\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address: "127.0.0.1:99999": port out of range 1-65535`}, 0},
		{"address port not a number", listener("address = \"127.0.0.1:http\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"127.0.0.1:http"`, "not a number"}, 0},
		{"address bad host", listener("address = \"bad host!:80\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"bad host!:80"`, "hostname"}, 0},
		{"address bad IPv4", listener("address = \"256.1.1.1:80\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"256.1.1.1:80"`}, 0},
		{"address IPv6 without brackets", listener("address = \"::1:80\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"::1:80"`, "[::1]:8080"}, 0},
		{"address IPv6 bad", listener("address = \"[fe80::zz]:80\"\nprotocol = \"tcp\"\ncluster = \"c\"") + clusterC, []string{`listeners[0] ("web").address`, `"[fe80::zz]:80"`, "not an IPv6 address"}, 0},
		{"same address", webOK + strings.Replace(webOK, `"web"`, `"web2"`, 1) + clusterC, []string{`listeners[1] ("web2").address`, `"127.0.0.1:8080"`, `listeners[0] ("web")`}, 0},
		{"same address, wildcards", strings.Replace(webOK, "127.0.0.1:8080", ":8080", 1) + strings.Replace(strings.Replace(webOK, `"web"`, `"web2"`, 1), "127.0.0.1:8080", "0.0.0.0:8080", 1) + clusterC, []string{`listeners[1] ("web2").address`, `"0.0.0.0:8080"`}, 0},
		{"tcp without cluster", listener("address = \":80\"\nprotocol = \"tcp\""), []string{`listeners[0] ("web").cluster`, "missing"}, 0},
		{"tcp unknown cluster", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"pgg\"") + "[[clusters]]\nname = \"pg\"\nendpoints = [\"127.0.0.1:5432\"]\n", []string{`listeners[0] ("web").cluster`, `"pgg"`, `no such cluster (did you mean "pg"?)`}, 0},
		{"tcp cluster but none defined", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"pg\""), []string{`listeners[0] ("web").cluster`, `"pg"`, "[[clusters]]"}, 0},
		{"tcp with routes", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]") + clusterC, []string{`listeners[0] ("web").routes`, "tcp listener has no routes"}, 0},
		{"tcp with http settings", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\nrequest_timeout = \"5s\"\nmax_header_bytes = 100") + clusterC, []string{`listeners[0] ("web").request_timeout`, `"5s"`, "only to http"}, 2},
		{"tcp with write_timeout", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\nwrite_timeout = \"5s\"") + clusterC, []string{`listeners[0] ("web").write_timeout`, `"5s"`, "only to http"}, 0},
		{"tcp with park_idle_connections", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\npark_idle_connections = true") + clusterC, []string{`listeners[0] ("web").park_idle_connections`, "true", "only to http"}, 0},
		{"tcp with trust_forwarded_for", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\ntrust_forwarded_for = false") + clusterC, []string{`listeners[0] ("web").trust_forwarded_for`, "false", "only to http"}, 0},
		{"write_timeout zero", webOK + "write_timeout = \"0s\"\n" + clusterC, []string{`listeners[0] ("web").write_timeout`, `"0s"`, "between 10ms and 24h", "default, 1m"}, 0},
		{"listener max_connections negative", webOK + "max_connections = -1\n" + clusterC, []string{`listeners[0] ("web").max_connections`, "-1", "between 0 and 16777216"}, 0},
		{"server max_connections negative", "[server]\nmax_connections = -1\n", []string{"server.max_connections", "-1", "between 0 and 16777216", "open-file limit"}, 0},
		{"tcp idle_timeout zero", listener("address = \":80\"\nprotocol = \"tcp\"\ncluster = \"c\"\nidle_timeout = \"0s\"") + clusterC, []string{`listeners[0] ("web").idle_timeout`, `"0s"`, "between 100ms and 168h", "default, 1h"}, 0},
		{"http without routes", listener("address = \":80\"\nprotocol = \"http\""), []string{`listeners[0] ("web").routes`, "at least one route"}, 0},
		{"http with cluster", listener("address = \":80\"\nprotocol = \"http\"\ncluster = \"c\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]") + clusterC, []string{`listeners[0] ("web").cluster`, `"c"`, "routes"}, 0},
		{"http timeouts negative", listener("address = \":80\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\nrequest_timeout = \"-1s\"\nheader_timeout = \"0s\"\nidle_timeout = \"-2m\"") + clusterC, []string{`listeners[0] ("web").request_timeout`, `"-1s"`}, 3},
		{"max_header_bytes negative", listener("address = \":80\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/\", cluster = \"c\" }]\nmax_header_bytes = -1") + clusterC, []string{`listeners[0] ("web").max_header_bytes`, "-1"}, 0},

		// Routes.
		{"route without match", httpWith(`{ cluster = "c" }`), []string{`listeners[0] ("web").routes[0]`, "prefix", "path"}, 0},
		{"route with prefix and path", httpWith(`{ prefix = "/a", path = "/b", cluster = "c" }`), []string{`listeners[0] ("web").routes[0]`, `"/a"`, `"/b"`, "keep one"}, 0},
		{"prefix without slash", httpWith(`{ prefix = "api", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].prefix`, `"api"`, `start with "/"`}, 0},
		{"path without slash", httpWith(`{ path = "health", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].path`, `"health"`, `start with "/"`}, 0},
		{"host star inside", httpWith(`{ host = "api.*.example.com", prefix = "/", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].host`, `"api.*.example.com"`, `"*.example.com"`}, 0},
		{"host star alone", httpWith(`{ host = "*", prefix = "/", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].host`, `"*"`, "leave host out"}, 0},
		{"host star in label", httpWith(`{ host = "a*.example.com", prefix = "/", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].host`, `"a*.example.com"`}, 0},
		{"host double star", httpWith(`{ host = "*.*.example.com", prefix = "/", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].host`, `"*.*.example.com"`}, 0},
		{"host bad", httpWith(`{ host = "exa mple.com", prefix = "/", cluster = "c" }`), []string{`listeners[0] ("web").routes[0].host`, `"exa mple.com"`}, 0},
		{"route without action", httpWith(`{ prefix = "/" }`), []string{`listeners[0] ("web").routes[0]`, "needs an action"}, 0},
		{"route with two actions", httpWith(`{ prefix = "/", cluster = "c", direct_response = { status = 200 } }`), []string{`listeners[0] ("web").routes[0]`, `"c"`, "both cluster"}, 0},
		{"route unknown cluster", listener("address = \":80\"\nprotocol = \"http\"\nroutes = [{ prefix = \"/a\", cluster = \"c\" }, { prefix = \"/\", cluster = \"backnd\" }]") + clusterC + "[[clusters]]\nname = \"backend\"\nendpoints = [\"127.0.0.1:9001\"]\n", []string{`listeners[0] ("web").routes[1].cluster`, `"backnd"`, `did you mean "backend"?`}, 0},
		{"route unknown cluster, nothing close", httpWith(`{ prefix = "/", cluster = "zzz" }`), []string{`listeners[0] ("web").routes[0].cluster`, `"zzz"`, "clusters: c"}, 0},
		{"status too low", httpWith(`{ prefix = "/", direct_response = { status = 99 } }`), []string{`listeners[0] ("web").routes[0].direct_response.status`, "99", "between 200 and 599"}, 0},
		{"status too high", httpWith(`{ prefix = "/", direct_response = { status = 600 } }`), []string{`listeners[0] ("web").routes[0].direct_response.status`, "600", "between 200 and 599"}, 0},
		{"status missing", httpWith(`{ prefix = "/", direct_response = { body = "hi" } }`), []string{`listeners[0] ("web").routes[0].direct_response.status`, "0", "between 200 and 599"}, 0},
		{"status informational", httpWith(`{ prefix = "/", direct_response = { status = 101 } }`), []string{`listeners[0] ("web").routes[0].direct_response.status`, "101", "final HTTP status"}, 0},
		{"status 204 with body", httpWith(`{ prefix = "/", direct_response = { status = 204, body = "x" } }`), []string{`listeners[0] ("web").routes[0].direct_response.body`, `"x"`, "204", "no body"}, 0},
		{"content_type bad", httpWith(`{ prefix = "/", direct_response = { status = 200, content_type = "text plain" } }`), []string{`listeners[0] ("web").routes[0].direct_response.content_type`, `"text plain"`}, 0},

		// Clusters.
		{"cluster name missing", "[[clusters]]\nendpoints = [\"a:1\"]\n", []string{"clusters[0].name", "missing"}, 0},
		{"cluster name duplicate", clusterC + clusterC, []string{`clusters[1] ("c").name`, `"c"`, "duplicate"}, 0},
		{"cluster without endpoints", "[[clusters]]\nname = \"c\"\n", []string{`clusters[0] ("c").endpoints`, "at least one endpoint"}, 0},
		{"cluster empty endpoints", "[[clusters]]\nname = \"c\"\nendpoints = []\n", []string{`clusters[0] ("c").endpoints`, "at least one endpoint"}, 0},
		{"endpoint without port", "[[clusters]]\nname = \"c\"\nendpoints = [\"db.internal\"]\n", []string{`clusters[0] ("c").endpoints[0]`, `"db.internal"`, "host:port"}, 0},
		{"endpoint port 0", "[[clusters]]\nname = \"c\"\nendpoints = [\"a:1\", \"db.internal:0\"]\n", []string{`clusters[0] ("c").endpoints[1]`, `"db.internal:0"`, "1-65535"}, 0},
		{"endpoint port too big", "[[clusters]]\nname = \"c\"\nendpoints = [\"db.internal:70000\"]\n", []string{`clusters[0] ("c").endpoints[0]`, `"db.internal:70000"`, "1-65535"}, 0},
		{"endpoint without host", "[[clusters]]\nname = \"c\"\nendpoints = [\":5432\"]\n", []string{`clusters[0] ("c").endpoints[0]`, `":5432"`, "missing host"}, 0},
		{"lb_policy unknown", clusterC + "[[clusters]]\nname = \"pg\"\nendpoints = [\"a:1\"]\nlb_policy = \"fastest\"\n", []string{`clusters[1] ("pg").lb_policy: "fastest": unknown policy (use round_robin, least_request, random, ring_hash or maglev)`}, 0},
		{"connect_timeout zero", "[[clusters]]\nname = \"c\"\nendpoints = [\"a:1\"]\nconnect_timeout = \"0s\"\n", []string{`clusters[0] ("c").connect_timeout`, `"0s"`, "between 10ms and 5m", "default, 5s"}, 0},
		{"idle_timeout negative", "[[clusters]]\nname = \"c\"\nendpoints = [\"a:1\"]\nidle_timeout = \"-1m\"\n", []string{`clusters[0] ("c").idle_timeout`, `"-1m0s"`, "between 100ms and 24h", "default, 1m30s"}, 0},
		{"max_idle negative", "[[clusters]]\nname = \"c\"\nendpoints = [\"a:1\"]\nmax_idle_per_endpoint = -3\n", []string{`clusters[0] ("c").max_idle_per_endpoint`, "-3"}, 0},
	}
	seen := map[string]bool{}
	for i, tt := range tests {
		if seen[tt.name] {
			t.Fatalf("two rows named %q", tt.name)
		}
		seen[tt.name] = true
		dumpBadConfig(t, "bad", i, tt.toml)
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.toml), "bad.toml")
			if err == nil {
				t.Fatalf("accepted:\n%s\nas %+v", tt.toml, c)
			}
			msg := err.Error()
			var e *Error
			if !asError(err, &e) {
				t.Fatalf("error is %T, want *Error: %v", err, err)
			}
			want := max(tt.problems, 1)
			if len(e.Problems) != want {
				t.Errorf("%d problems, want %d:\n%s", len(e.Problems), want, msg)
			}
			for _, line := range strings.Split(msg, "\n") {
				if !strings.HasPrefix(line, "bad.toml: ") && !strings.HasPrefix(line, "   ") {
					t.Errorf("line does not start with the source: %q", line)
				}
			}
			for _, line := range strings.Split(msg, "\nbad.toml: ") {
				if containsAll(line, tt.want) {
					return
				}
			}
			t.Errorf("no line of the error contains all of %q:\n%s", tt.want, msg)
		})
	}
}

// dumpBadConfigsEnv names a directory the bad-config tables
// (TestBadConfigs, TestRoutingKeysRefused, TestResilienceInvalid) write
// each of their configs to, as TABLE-NNN.toml: integration's
// TestValidateAndServeAgreeOnBadConfigs runs both verbs on every row.
const dumpBadConfigsEnv = "HOTPROXY_DUMP_BAD_CONFIGS"

// dumpBadConfig writes row i of a bad-config table where
// dumpBadConfigsEnv says.
func dumpBadConfig(t *testing.T, table string, i int, data string) {
	t.Helper()
	dir := os.Getenv(dumpBadConfigsEnv)
	if dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%03d.toml", table, i)), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func TestGoodConfigs(t *testing.T) {
	for name, data := range map[string]string{
		"port 0 twice":         strings.Replace(webOK, "127.0.0.1:8080", "127.0.0.1:0", 1) + strings.Replace(strings.Replace(webOK, `"web"`, `"web2"`, 1), "127.0.0.1:8080", "127.0.0.1:0", 1) + clusterC,
		"all addresses":        strings.Replace(webOK, "127.0.0.1:8080", ":8080", 1) + clusterC,
		"IPv6 and hostname":    strings.Replace(webOK, "127.0.0.1:8080", "[::1]:8080", 1) + "[[clusters]]\nname = \"c\"\nendpoints = [\"[::1]:9000\", \"backend-1.internal:9000\", \"localhost:1\"]\n",
		"wildcard host":        httpWith(`{ host = "*.example.com", prefix = "/", cluster = "c" }`),
		"host with port":       httpWith(`{ host = "example.com:8080", path = "/x", cluster = "c" }`),
		"least_request random": "[[clusters]]\nname = \"a\"\nendpoints = [\"a:1\"]\nlb_policy = \"least_request\"\n[[clusters]]\nname = \"b\"\nendpoints = [\"a:1\"]\nlb_policy = \"random\"\n",
		"no listeners":         "",
		"reuse_port false":     "[server]\nreuse_port = false\n",
		"log json debug":       "[log]\nlevel = \"debug\"\nformat = \"json\"\n",
		"max concurrency":      "[server]\nconcurrency = 1024\n",
		"admin remote allowed": "[admin]\naddress = \"0.0.0.0:9901\"\nallow_remote = true\n",
		"admin IPv6 loopback":  "[admin]\naddress = \"[::1]:9901\"\n",
		"admin localhost":      "[admin]\naddress = \"localhost:9901\"\n",
		"admin 127.0.0.2":      "[admin]\naddress = \"127.0.0.2:0\"\n",
		"status 304 no body":   httpWith(`{ prefix = "/", direct_response = { status = 304 } }`),
		"http keys written":    webOK + "write_timeout = \"1s\"\ntrust_forwarded_for = false\nmax_connections = 10\npark_idle_connections = true\n" + clusterC,
	} {
		if _, err := Parse([]byte(data), name+".toml"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
