package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestRoundRobinSpreads sends 300 requests, a connection each, to a
// round_robin cluster of three backends. Round robin is per worker, so the
// split is not exact across workers: each backend must get at least a
// quarter of its fair share, and the counts must add up exactly.
func TestRoundRobinSpreads(t *testing.T) {
	t.Parallel()
	const requests = 300
	backends := []*harness.HTTPBackend{
		harness.StartHTTPBackend(t, "b0"),
		harness.StartHTTPBackend(t, "b1"),
		harness.StartHTTPBackend(t, "b2"),
	}
	var eps []string
	for _, b := range backends {
		eps = append(eps, b.Addr)
	}
	p := harness.Start(t, httpProxyConfig(eps...))

	res, err := loadgen.Do(context.Background(), loadgen.Options{
		URL:      p.URL("web", "/"),
		Mode:     loadgen.ConnPerRequest,
		Clients:  4,
		Requests: requests,
		Duration: 60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.OK() != requests || res.Failed() != 0 {
		t.Fatalf("want %d ok, got %v", requests, res)
	}
	var sum int64
	var counts []string
	fair := int64(requests / len(backends))
	for _, b := range backends {
		n := b.Requests()
		sum += n
		counts = append(counts, fmt.Sprintf("%s=%d", b.ID, n))
		if n < fair/4 {
			t.Errorf("backend %s got %d requests, less than a quarter of its fair share %d", b.ID, n, fair)
		}
	}
	t.Logf("split: %s", strings.Join(counts, " "))
	if sum != requests {
		t.Errorf("backends got %d requests in all, want exactly %d", sum, requests)
	}
}

// TestDirectResponses checks routes answered by the proxy itself: status
// and body, exact path against prefix, host matching with wildcards, and the
// %PID% and %EPOCH% substitutions.
func TestDirectResponses(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, harness.Config{
		Concurrency: testConcurrency,
		Listeners: []harness.Listener{{
			Name: "web",
			Routes: []harness.Route{
				{Host: "a.example.com", Prefix: "/", Status: 200, Body: "host a\n"},
				{Host: "*.example.com", Prefix: "/", Status: 200, Body: "wildcard\n"},
				{Path: "/teapot", Status: 418, Body: "short and stout\n"},
				{Prefix: "/gone/", Status: 410, Body: ""},
				{Prefix: "/", Status: 200, Body: "pid %PID% epoch %EPOCH%\n"},
			},
		}},
	})
	c := newClient(10 * time.Second)
	for _, tc := range []struct {
		host, path string
		status     int
		body       string
	}{
		{"", "/teapot", 418, "short and stout\n"},
		{"", "/teapot/", 200, fmt.Sprintf("pid %d epoch 0\n", p.PID())},
		{"", "/gone/x", 410, ""},
		{"", "/", 200, fmt.Sprintf("pid %d epoch 0\n", p.PID())},
		{"a.example.com", "/teapot", 200, "host a\n"},
		{"b.example.com", "/teapot", 200, "wildcard\n"},
		{"example.com", "/teapot", 418, "short and stout\n"},
	} {
		req, _ := http.NewRequest(http.MethodGet, p.URL("web", tc.path), nil)
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s%s: %v", tc.host, tc.path, err)
		}
		var b strings.Builder
		_, err = ioCopy(&b, resp)
		if err != nil {
			t.Fatalf("%s%s: body: %v", tc.host, tc.path, err)
		}
		if resp.StatusCode != tc.status || b.String() != tc.body {
			t.Errorf("host %q path %s: got %d %q, want %d %q", tc.host, tc.path, resp.StatusCode, b.String(), tc.status, tc.body)
		}
		if cl := resp.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(tc.body)) {
			t.Errorf("host %q path %s: Content-Length %s for a body of %d", tc.host, tc.path, cl, len(tc.body))
		}
	}
}

// TestDefaultConfig runs `serve` with no -c: the embedded default answers
// on 127.0.0.1:10000 with its version, epoch and pid. Those ports are
// fixed, so the test runs only when both are free.
func TestDefaultConfig(t *testing.T) {
	for _, a := range []string{harness.DefaultConfigListener, harness.DefaultConfigAdmin} {
		if !harness.PortFree(a) {
			t.Skipf("the default config's port %s is in use on this machine", a)
		}
	}
	p := harness.LaunchDefault(t)
	if err := p.WaitReady(harness.DefaultReadyTimeout); err != nil {
		t.Fatalf("%v\n%s", err, p.Output())
	}
	resp, body := get(t, newClient(10*time.Second), p.URL("default", "/anything"))
	want := fmt.Sprintf("epoch 0 pid %d\n", p.PID())
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "hotproxy ") || !strings.HasSuffix(body, want) {
		t.Errorf("got %d %q, want 200 \"hotproxy VERSION %s\"", resp.StatusCode, body, want)
	}
	if code := p.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestUpstreamDown sends requests to a cluster whose only endpoint refuses
// connections: the client gets a 503, not a hang and not a broken
// connection.
func TestUpstreamDown(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, httpProxyConfig(harness.ClosedAddr(t)))
	c := newClient(10 * time.Second)
	for i := 0; i < 3; i++ {
		start := time.Now()
		resp, err := c.Get(p.URL("web", "/"))
		if err != nil {
			var ue interface{ Timeout() bool }
			if errors.As(err, &ue) && ue.Timeout() {
				t.Fatalf("no answer within the client's 10s: %v", err)
			}
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("request %d: got %s, want 503", i, resp.Status)
		}
		t.Logf("request %d: %s in %v", i, resp.Status, time.Since(start).Round(time.Millisecond))
	}
}
