package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// testConcurrency is the worker count every test proxy runs with: more
// than one, so that per-worker behaviour shows, and no more than the CI
// machine's cores.
const testConcurrency = 2

// newClient returns an HTTP client with its own transport (no proxy from
// the environment, no HTTP/2) and a bound on every request.
func newClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:              nil,
			DisableCompression: true,
			ForceAttemptHTTP2:  false,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// httpProxyConfig is one http listener "web" routing everything to the
// cluster "backend" of the given endpoints.
func httpProxyConfig(endpoints ...string) harness.Config {
	return harness.Config{
		Concurrency: testConcurrency,
		DrainTime:   "5s",
		Listeners: []harness.Listener{{
			Name:   "web",
			Routes: []harness.Route{{Prefix: "/", Cluster: "backend"}},
		}},
		Clusters: []harness.Cluster{{Name: "backend", LBPolicy: "round_robin", Endpoints: endpoints, ConnectTimeout: "1s"}},
	}
}

// get GETs url and returns the response (body read and closed) and body,
// failing the test on a transport error.
func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(b)
}

// wantContains fails the test unless s contains every one of subs.
func wantContains(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s does not mention %q:\n%s", what, sub, s)
		}
	}
}

// ioCopy reads resp's body into w and closes it.
func ioCopy(w io.Writer, resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}
