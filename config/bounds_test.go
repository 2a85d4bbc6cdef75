package config

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// schemaKeysOfKind lists the key paths of the schema whose values are of
// kind k, indices left out: "listeners.idle_timeout".
func schemaKeysOfKind(k kind) []string {
	var keys []string
	var walk func(t *table, prefix string)
	walk = func(t *table, prefix string) {
		for _, f := range t.fields {
			if f.kind == k {
				keys = append(keys, prefix+f.name)
			}
			if f.sub != nil {
				walk(f.sub, prefix+f.name+".")
			}
		}
	}
	walk(rootSchema(), "")
	return keys
}

// declaredBounds maps every key of kind k that declares a bound, by its
// path in the schema, to its range.
func declaredBounds(k kind) map[string][2]int64 {
	m := map[string][2]int64{}
	for _, path := range schemaKeysOfKind(k) {
		if f := lookupField(path); f.hasBound {
			m[path] = [2]int64{f.min, f.max}
		}
	}
	return m
}

// TestEveryNumberHasABound: a number or a duration without a bound is how
// max_header_bytes near 2^63 and flush_interval = "1ns" got through.
func TestEveryNumberHasABound(t *testing.T) {
	durations, ints := schemaKeysOfKind(kDuration), schemaKeysOfKind(kInt)
	if len(durations) < 10 || len(ints) < 5 {
		t.Fatalf("the schema walk found too few keys to prove anything: %v %v", durations, ints)
	}
	for _, k := range append(durations, ints...) {
		if !lookupField(k).hasBound {
			t.Errorf("key %s declares no bound (add a bound:\"MIN..MAX\" tag to its field)", k)
		}
	}
	for k, b := range declaredBounds(kDuration) {
		if b[0] <= 0 {
			t.Errorf("%s: bound %v..%v: a duration's minimum must be above 0", k, time.Duration(b[0]), time.Duration(b[1]))
		}
	}
}

// boundCase places "name = value" where the key path puts it, in a config
// that is otherwise valid, and says how an error names the key.
func boundCase(t *testing.T, path, value string) (data, key string) {
	t.Helper()
	section, name, _ := strings.Cut(path, ".")
	kv := name + " = " + value + "\n"
	switch section {
	case "server", "hot_restart", "stats", "watchdog", "overload", "xds":
		extra := ""
		if path == "server.parent_shutdown_time" {
			// parent_shutdown_time must also be at least drain_time.
			extra = fmt.Sprintf("drain_time = %q\n", time.Duration(declaredBounds(kDuration)["server.drain_time"][0]))
		}
		return "[" + section + "]\n" + extra + kv + webOK + clusterC, path
	case "listeners":
		if path == "listeners.routes.direct_response.status" {
			return httpWith(`{ prefix = "/", direct_response = { status = ` + value + ` } }`), `listeners[0] ("web").routes[0].direct_response.status`
		}
		switch path {
		case "listeners.routes.timeout", "listeners.routes.num_retries":
			return httpWith(`{ prefix = "/", cluster = "c", retry_on = ["5xx"], ` + strings.TrimPrefix(path, "listeners.routes.") + ` = ` + value + ` }`),
				`listeners[0] ("web").routes[0].` + strings.TrimPrefix(path, "listeners.routes.")
		case "listeners.routes.per_try_timeout":
			return httpWith(`{ prefix = "/", cluster = "c", retry_on = ["5xx"], timeout = "24h", per_try_timeout = ` + value + ` }`),
				`listeners[0] ("web").routes[0].per_try_timeout`
		case "listeners.tls.handshake_timeout", "listeners.tls.session_ticket_rotation":
			return webOK + "[listeners.tls]\ncertificates = [{ cert = \"../examples/tls/a.example.com.pem\", key = \"../examples/tls/a.example.com.key\" }]\n" +
					strings.TrimPrefix(path, "listeners.tls.") + " = " + value + "\n" + clusterC,
				`listeners[0] ("web").tls.` + strings.TrimPrefix(path, "listeners.tls.")
		case "listeners.routes.weighted_clusters.weight":
			return httpWith(`{ prefix = "/", weighted_clusters = [{ cluster = "c", weight = ` + value + ` }] }`),
				`listeners[0] ("web").routes[0].weighted_clusters[0].weight`
		case "listeners.access_log.queue_size":
			return webOK + "[[listeners.access_log]]\npath = \"/tmp/a.log\"\nqueue_size = " + value + "\n" + clusterC,
				`listeners[0] ("web").access_log[0].queue_size`
		}
		return webOK + kv + clusterC, `listeners[0] ("web").` + name
	case "clusters":
		if path == "clusters.health_check.timeout" {
			// The first round of checks must fit in handoff_timeout.
			return "[hot_restart]\nhandoff_timeout = \"1h\"\n" + webOK + clusterC + kv, `clusters[0] ("c").` + name
		}
		return webOK + clusterC + kv, `clusters[0] ("c").` + name
	}
	t.Fatalf("no way to place %s in a config", path)
	return "", ""
}

// TestBounds checks every bound both ways: the value at each end passes,
// the next one out fails, naming the key, the value and the range.
func TestBounds(t *testing.T) {
	type row struct {
		path                string
		in                  []string // pass
		out                 []string // fail
		outShown, rangeText []string // in the failures' messages
	}
	var rows []row
	for path, bb := range declaredBounds(kDuration) {
		b := struct{ min, max time.Duration }{time.Duration(bb[0]), time.Duration(bb[1])}
		q := func(d time.Duration) string { return strconv.Quote(d.String()) }
		out := []string{q(b.min - 1), q(b.max + 1), q(0), q(-b.min)}
		if path == "listeners.routes.timeout" || path == "listeners.routes.per_try_timeout" || path == "watchdog.kill_timeout" {
			// 0 is what leaving them out means (the listener's
			// request_timeout; no bound per try; never kill).
			out = []string{q(b.min - 1), q(b.max + 1), q(-b.min)}
		}
		rows = append(rows, row{
			path:      path,
			in:        []string{q(b.min), q(b.max)},
			out:       out,
			outShown:  out,
			rangeText: []string{"must be between " + shortDuration(b.min) + " and " + shortDuration(b.max), "default, "},
		})
	}
	for path, bb := range declaredBounds(kInt) {
		b := struct{ min, max int }{int(bb[0]), int(bb[1])}
		s := strconv.Itoa
		rows = append(rows, row{
			path:      path,
			in:        []string{s(b.min), s(b.max)},
			out:       []string{s(b.min - 1), s(b.max + 1)},
			outShown:  []string{s(b.min - 1), s(b.max + 1)},
			rangeText: []string{fmt.Sprintf("must be between %d and %d", b.min, b.max)},
		})
	}
	// A tcp listener shares these two bounds with http.
	tcp := func(kv string) string {
		return listener("address = \"127.0.0.1:8080\"\nprotocol = \"tcp\"\ncluster = \"c\"\n"+kv) + clusterC
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.path, b.path) })
	for _, r := range rows {
		t.Run(r.path, func(t *testing.T) {
			for _, v := range r.in {
				data, _ := boundCase(t, r.path, v)
				if _, err := Parse([]byte(data), "b.toml"); err != nil {
					t.Errorf("%s = %s refused, want accepted: %v", r.path, v, err)
				}
			}
			for i, v := range r.out {
				data, key := boundCase(t, r.path, v)
				_, err := Parse([]byte(data), "b.toml")
				if err == nil {
					t.Errorf("%s = %s accepted, want refused", r.path, v)
					continue
				}
				want := append([]string{"b.toml: " + key + ": " + r.outShown[i] + ": "}, r.rangeText...)
				if !containsAll(err.Error(), want) {
					t.Errorf("%s = %s: error %q does not contain all of %q", r.path, v, err, want)
				}
			}
			if r.path == "listeners.idle_timeout" || r.path == "listeners.max_connections" {
				name := strings.TrimPrefix(r.path, "listeners.")
				for _, v := range r.in {
					if _, err := Parse([]byte(tcp(name+" = "+v)), "b.toml"); err != nil {
						t.Errorf("tcp %s = %s refused: %v", name, v, err)
					}
				}
				for _, v := range r.out {
					if _, err := Parse([]byte(tcp(name+" = "+v)), "b.toml"); err == nil || !strings.Contains(err.Error(), `listeners[0] ("web").`+name) {
						t.Errorf("tcp %s = %s: %v, want refused naming the key", name, v, err)
					}
				}
			}
		})
	}
	if len(rows) < 15 {
		t.Fatalf("only %d bounds tested", len(rows))
	}
}

// TestIssue8Values are the values of the security report (issue 8, item
// 10) that validated and then broke at run time.
func TestIssue8Values(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{webOK + "max_header_bytes = 9223372036854775000\n" + clusterC, `listeners[0] ("web").max_header_bytes: 9223372036854775000: must be between 1024 and 1048576`},
		{"[stats]\nflush_interval = \"1ns\"\n", `stats.flush_interval: "1ns": must be between 10ms and 5m (leave it out for the default, 1s)`},
		{"[admin]\naddress = \"0.0.0.0:9901\"\n", `admin.address: "0.0.0.0:9901": not a loopback address`},
		{"[server]\nparent_shutdown_time = \"2562047h\"\n", `server.parent_shutdown_time: "2562047h0m0s": must be between 100ms and 168h`},
	} {
		_, err := Parse([]byte(tc.data), "i.toml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse:\n%s\ngot %v\nwant an error containing %q", tc.data, err, tc.want)
		}
	}
}

// TestExampleShowsDefaults holds examples/hotproxy.toml to its promise:
// every key it sets is at its default in code, so leaving any one of
// them out gives the same config. Keys that have no default (names,
// addresses, what goes where) are the example's own and are skipped.
func TestExampleShowsDefaults(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse(data, examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		t.Fatal(err)
	}
	noDefault := map[string]bool{
		"listeners.name": true, "listeners.address": true, "listeners.protocol": true,
		"listeners.cluster": true, "listeners.routes": true,
		"clusters.name": true, "clusters.endpoints": true,
		// No default: left out, the check is a TCP connect.
		"clusters.health_check.path": true,
		// No default: the file an access log goes to.
		"listeners.access_log.path": true,
		// No default: the key of ring_hash and maglev, which need one.
		"clusters.hash_on": true,
		// No default: which files, names and suites are the example's own.
		"listeners.tls.certificates": true, "listeners.tls.cipher_suites": true,
		"listeners.tls.session_ticket_keys_file": true,
		"listeners.routes.server_name":           true, "listeners.sni_routes": true,
		"listeners.http2_cleartext": true, "clusters.http2": true,
		"clusters.tls.ca": true, "clusters.tls.server_name": true,
		"clusters.tls.cert": true, "clusters.tls.key": true,
		// No default: the control plane and the node are the example's own.
		"xds.cluster": true, "xds.node_id": true, "xds.node_cluster": true,
		// No default: when an overload action acts is the example's own.
		"overload.stop_accepting.pressure_percent": true, "overload.refuse_requests.pressure_percent": true,
		"overload.disable_keepalive.pressure_percent": true, "overload.shrink_timeouts.pressure_percent": true,
		"overload.shrink_heap.pressure_percent": true, "overload.reset_connections.pressure_percent": true,
	}
	checked := 0
	var walk func(m map[string]any, path, human string)
	walk = func(m map[string]any, path, human string) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := m[k]
			if noDefault[path+k] {
				continue
			}
			if _, hashed := m["hash_on"]; hashed && path+k == "clusters.lb_policy" {
				continue // ring_hash or maglev: hash_on needs it
			}
			if sub, ok := v.(map[string]any); ok {
				walk(sub, path+k+".", human+k+".")
				continue
			}
			if l, ok := v.([]map[string]any); ok {
				for i, e := range l {
					walk(e, path+k+".", fmt.Sprintf("%s%s[%d].", human, k, i))
				}
				continue
			}
			delete(m, k)
			var buf bytes.Buffer
			if err := toml.NewEncoder(&buf).Encode(raw); err != nil {
				t.Fatal(err)
			}
			m[k] = v
			got, err := Parse(buf.Bytes(), examplePath)
			checked++
			switch {
			case err != nil:
				t.Errorf("examples/hotproxy.toml without %s%s is refused (does it have a default?): %v", human, k, err)
			case !reflect.DeepEqual(got, want):
				t.Errorf("examples/hotproxy.toml sets %s%s = %v, which is not its default: leaving it out changes the config", human, k, v)
			}
		}
	}
	walk(raw, "", "")
	if checked < 25 {
		t.Fatalf("only %d keys checked: the walk proves nothing", checked)
	}
}
