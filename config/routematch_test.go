package config

import (
	"reflect"
	"strings"
	"testing"
)

const clusterD = "[[clusters]]\nname = \"d\"\nendpoints = [\"127.0.0.1:9001\"]\n"

// TestRouteHeadersAndSplitParse: header matches and a weighted split are
// read from the file as written, an exact "" included.
func TestRouteHeadersAndSplitParse(t *testing.T) {
	data := listener(`address = "127.0.0.1:8080"
protocol = "http"
[[listeners.routes]]
prefix = "/"
retry_on = ["5xx"]
  [[listeners.routes.headers]]
  name = ":method"
  exact = "POST"
  [[listeners.routes.headers]]
  name = "X-Empty"
  exact = ""
  [[listeners.routes.headers]]
  name = "x-canary"
  prefix = "On"
  ignore_case = true
  invert = true
  [[listeners.routes.headers]]
  name = "x-user"
  present = true
  [[listeners.routes.weighted_clusters]]
  cluster = "c"
  weight = 3
  [[listeners.routes.weighted_clusters]]
  cluster = "d"
  weight = 1`) + clusterC + clusterD
	c := mustParse(t, data, "r.toml")
	r := c.Listeners[0].Routes[0]
	post, empty := "POST", ""
	want := []HeaderMatch{
		{Name: ":method", Exact: &post},
		{Name: "X-Empty", Exact: &empty},
		{Name: "x-canary", Prefix: "On", IgnoreCase: true, Invert: true},
		{Name: "x-user", Present: true},
	}
	if !reflect.DeepEqual(r.Headers, want) {
		t.Errorf("headers = %+v, want %+v", r.Headers, want)
	}
	if ws := []WeightedCluster{{"c", 3}, {"d", 1}}; !reflect.DeepEqual(r.WeightedClusters, ws) {
		t.Errorf("weighted_clusters = %+v, want %+v", r.WeightedClusters, ws)
	}
	if !r.ProxiesToCluster() || strings.Join(r.ClusterNames(), ",") != "c,d" {
		t.Errorf("ProxiesToCluster %v, ClusterNames %q", r.ProxiesToCluster(), r.ClusterNames())
	}
	// A split route retries like a route with a cluster: num_retries
	// gets its default.
	if r.NumRetries == nil || *r.NumRetries != DefaultNumRetries {
		t.Errorf("num_retries = %v, want %d", r.NumRetries, DefaultNumRetries)
	}
	cl := r.Clone()
	*cl.Headers[0].Exact = "GET"
	cl.WeightedClusters[0].Weight = 9
	if *r.Headers[0].Exact != "POST" || r.WeightedClusters[0].Weight != 3 {
		t.Errorf("Clone shares memory with the original")
	}
}

// TestRouteHeadersAndSplitRefused: every wrong header match and
// weighted split is refused with the key that is wrong.
func TestRouteHeadersAndSplitRefused(t *testing.T) {
	hdr := func(h string) string { return httpWith(`{ prefix = "/", cluster = "c", headers = [` + h + `] }`) }
	split := func(ws string) string {
		return httpWith(`{ prefix = "/", weighted_clusters = [`+ws+`] }`) + clusterD
	}
	const r0 = `listeners[0] ("web").routes[0]`
	tests := []struct {
		name, data string
		want       []string
	}{
		{"header without name", hdr(`{ exact = "x" }`), []string{r0 + `.headers[0].name: missing`}},
		{"header name with a space", hdr(`{ name = "x user", exact = "x" }`), []string{r0 + `.headers[0] ("x user").name: "x user": not a header field name`}},
		{"header name with a colon", hdr(`{ name = "x:y", present = true }`), []string{r0 + `.headers[0] ("x:y").name: "x:y": not a header field name`}},
		{"pseudo-header other than :method", hdr(`{ name = ":authority", exact = "a" }`), []string{r0 + `.headers[0] (":authority").name: ":authority": of the pseudo-header fields only ":method"`}},
		{"header without a test", hdr(`{ name = "x-a" }`), []string{r0 + `.headers[0] ("x-a"): needs one test: exact`}},
		{"header exact and prefix", hdr(`{ name = "x-a", exact = "a", prefix = "b" }`), []string{r0 + `.headers[0] ("x-a"): has exact and prefix; keep one test`}},
		{"header prefix and present", hdr(`{ name = "x-a", present = true, prefix = "b" }`), []string{r0 + `.headers[0] ("x-a"): has prefix and present; keep one test`}},
		{"header exact and present", hdr(`{ name = "x-a", exact = "", present = true }`), []string{r0 + `.headers[0] ("x-a"): has exact and present; keep one test`}},
		{"header ignore_case with present", hdr(`{ name = "x-a", present = true, ignore_case = true }`), []string{r0 + `.headers[0] ("x-a").ignore_case: does nothing with present`}},
		{"second header wrong", hdr(`{ name = "x-a", present = true }, { name = "", present = true }`), []string{r0 + `.headers[1].name: missing`}},
		{"header unknown key", hdr(`{ name = "x-a", regex = "a.*" }`), []string{r0 + `.headers[0] ("x-a").regex: unknown key`}},
		{"cluster and weighted_clusters", httpWith(`{ prefix = "/", cluster = "c", weighted_clusters = [{ cluster = "c", weight = 1 }] }`),
			[]string{r0 + `: has both cluster ("c") and weighted_clusters; keep one`}},
		{"weighted_clusters and direct_response", httpWith(`{ prefix = "/", weighted_clusters = [{ cluster = "c", weight = 1 }], direct_response = { status = 200 } }`),
			[]string{r0 + `: has both weighted_clusters and direct_response; keep one`}},
		{"weight zero", split(`{ cluster = "c", weight = 0 }, { cluster = "d", weight = 1 }`), []string{r0 + `.weighted_clusters[0].weight: 0: `, "must be between 1 and 1000000"}},
		{"weight left out", split(`{ cluster = "c", weight = 1 }, { cluster = "d" }`), []string{r0 + `.weighted_clusters[1].weight: 0: `, "must be between 1 and 1000000"}},
		{"weight too high", split(`{ cluster = "c", weight = 1000001 }`), []string{r0 + `.weighted_clusters[0].weight: 1000001: `, "must be between 1 and 1000000"}},
		{"weighted cluster unknown", split(`{ cluster = "c", weight = 1 }, { cluster = "dd", weight = 1 }`), []string{r0 + `.weighted_clusters[1].cluster: "dd": no such cluster`}},
		{"weighted cluster missing", split(`{ weight = 1 }`), []string{r0 + `.weighted_clusters[0].cluster: missing`}},
		{"weighted cluster twice", split(`{ cluster = "c", weight = 1 }, { cluster = "c", weight = 2 }`), []string{r0 + `.weighted_clusters[1].cluster: "c": already in`}},
		{"connect with weighted_clusters", split(`{ cluster = "c", weight = 1 }], connect = true, headers = [{ name = "x", present = true }`), []string{r0 + `.connect: true needs cluster = "NAME"`}},
	}
	for i, tt := range tests {
		dumpBadConfig(t, "routematch", i, tt.data)
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
