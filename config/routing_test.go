package config

import (
	"strings"
	"testing"
)

// TestRoutingKeysRefused: each wrong retry, hash or access-log key is
// refused with a message naming the key and what to write instead.
func TestRoutingKeysRefused(t *testing.T) {
	tests := []struct {
		name, data string
		want       []string
	}{
		{"retry_on unknown", httpWith(`{ prefix = "/", cluster = "c", retry_on = ["5xxx"] }`),
			[]string{`routes[0].retry_on[0]: "5xxx": unknown condition (did you mean "5xx"?)`}},
		{"num_retries without retry_on", httpWith(`{ prefix = "/", cluster = "c", num_retries = 2 }`),
			[]string{`routes[0].num_retries: 2: does nothing without retry_on`}},
		{"per_try_timeout past timeout", httpWith(`{ prefix = "/", cluster = "c", retry_on = ["reset"], timeout = "1s", per_try_timeout = "2s" }`),
			[]string{`routes[0].per_try_timeout: "2s": longer than the route's timeout ("1s")`}},
		{"connect on a direct response", httpWith(`{ prefix = "/", direct_response = { status = 200 }, connect = true }`),
			[]string{`routes[0].connect: true needs cluster = "NAME"`}},
		{"retry keys on a direct response", httpWith(`{ prefix = "/", direct_response = { status = 200 }, retry_on = ["5xx"] }`),
			[]string{`routes[0]: timeout and retry keys apply to a route with a cluster`}},
		{"hash_on missing", webOK + clusterC + "lb_policy = \"maglev\"\n",
			[]string{`clusters[0] ("c").hash_on: missing: lb_policy "maglev" needs a key`}},
		{"hash_on unknown", webOK + clusterC + "lb_policy = \"ring_hash\"\nhash_on = \"ip\"\n",
			[]string{`hash_on: "ip": unknown key (write "header:NAME", "cookie:NAME" or "source_ip")`}},
		{"hash_on without hashing", webOK + clusterC + "hash_on = \"source_ip\"\n",
			[]string{`hash_on: "source_ip": applies to lb_policy "ring_hash" or "maglev" only`}},
		{"access_log unknown variable", webOK + "[[listeners.access_log]]\npath = \"/tmp/a.log\"\nformat = \"%STATUS%\"\n" + clusterC,
			[]string{`access_log[0].format: "%STATUS%": unknown variable %STATUS%`}},
		{"access_log unclosed", webOK + "[[listeners.access_log]]\npath = \"/tmp/a.log\"\nformat = \"%METHOD\"\n" + clusterC,
			[]string{`access_log[0].format: "%METHOD": a % is not closed`}},
		{"access_log relative path", webOK + "[[listeners.access_log]]\npath = \"a.log\"\n" + clusterC,
			[]string{`access_log[0].path: "a.log": must be an absolute path`}},
		{"access_log on tcp", listener("address = \"127.0.0.1:8080\"\nprotocol = \"tcp\"\ncluster = \"c\"\n[[listeners.access_log]]\npath = \"/tmp/a.log\"") + clusterC,
			[]string{`access_log: [[listeners.access_log]]: applies only to http listeners`}},
	}
	for i, tt := range tests {
		dumpBadConfig(t, "routing", i, tt.data)
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.data), "r.toml")
			if err == nil {
				t.Fatalf("accepted, want refused:\n%s", tt.data)
			}
			if !containsAll(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// TestRoutingDefaults: retry_on alone gets one retry; an access log
// gets the default format and queue; a format string splits into text
// and variables.
func TestRoutingDefaults(t *testing.T) {
	c := mustParse(t, httpWith(`{ prefix = "/", cluster = "c", retry_on = ["5xx"] }`)+
		"[[listeners.access_log]]\npath = \"/tmp/a.log\"\n", "r.toml")
	if r := c.Listeners[0].Routes[0]; r.NumRetries == nil || *r.NumRetries != DefaultNumRetries {
		t.Errorf("num_retries = %v, want %d", r.NumRetries, DefaultNumRetries)
	}
	if a := c.Listeners[0].AccessLog[0]; a.Format != DefaultAccessLogFormat || a.QueueSize != DefaultAccessLogQueue {
		t.Errorf("access_log defaults: %+v", a)
	}
	parts, err := AccessLogFormatVariables("a %METHOD% 100%% %PATH%")
	if err != nil || strings.Join(parts, "|") != "a |METHOD| 100% |PATH|" {
		t.Errorf("parts %q, %v", parts, err)
	}
}
