package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestXDSWeightedSplitMoved: a weighted split served by the demo control
// plane moves all traffic from one cluster to the other, 100:0, then
// 50:50, then 0:100, under steady keep-alive load that sees no failed
// request; a header-matched route before it sends x-canary: 1 to the
// second cluster whatever the weights.
func TestXDSWeightedSplitMoved(t *testing.T) {
	for _, protocol := range []string{"delta", "sotw"} {
		t.Run(protocol, func(t *testing.T) { testXDSWeightedSplitMoved(t, protocol) })
	}
}

func testXDSWeightedSplitMoved(t *testing.T, protocol string) {
	a := harness.StartHTTPBackend(t, "A")
	b := harness.StartHTTPBackend(t, "B")
	webAddr := harness.FreeAddr(t)
	routes := func(wa, wb int) []any {
		return []any{
			map[string]any{"match": map[string]any{"prefix": "/", "headers": []any{map[string]any{"name": "x-canary", "exact_match": "1"}}},
				"route": map[string]any{"cluster": "b"}},
			map[string]any{"match": map[string]any{"prefix": "/"}, "route": map[string]any{"weighted_clusters": map[string]any{
				"clusters": []any{map[string]any{"name": "a", "weight": wa}, map[string]any{"name": "b", "weight": wb}}}}},
		}
	}
	snap := xdsSnapshot{
		Listeners: map[string]string{"web": webAddr},
		RawRoutes: map[string][]any{"web": routes(100, 0)},
		Clusters:  map[string][]string{"a": {a.Addr}, "b": {b.Addr}},
	}
	cp := startDemoControlPlane(t, snap)

	ch := &chain{t: t, baseID: newBaseID()}
	tbl, path := statsTable(t)
	ch.statsPath = path
	cfg := xdsProxyConfig(protocol, cp.addr)
	cfg.Extra += "\n" + tbl
	ch.cfgPath = writeConfigFile(t, cfg.Allocate(t).TOML())
	g := ch.launch(0, harness.LaunchOptions{})
	if err := g.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("epoch 0: %v\n%s", err, g.Output())
	}
	ch.serving = g
	web := "http://" + webAddr + "/"
	client := newClient(5 * time.Second)
	for range 20 {
		if body, err := bodyFrom(client, web); err != nil || body != "A\n" {
			t.Fatalf("at 100:0: %q, %v; want A\n%s", body, err, g.Output())
		}
	}
	canary := func() string {
		req, _ := http.NewRequest(http.MethodGet, web, nil)
		req.Header.Set("X-Canary", "1")
		resp, err := client.Do(req)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		var body [16]byte
		n, _ := resp.Body.Read(body[:])
		return string(body[:n])
	}
	if got := canary(); got != "B\n" {
		t.Fatalf("x-canary: 1 at 100:0: %q, want B (the header-matched route)", got)
	}

	load := startSteadyLoad(t, loadgen.Options{
		URL: web + "load", Mode: loadgen.KeepAlive, Clients: 4, Rate: 100,
		Check: func(_ *http.Response, body []byte) error {
			switch string(body) {
			case "A\n", "B\n":
				return nil
			}
			return fmt.Errorf("body %q is no backend's", body)
		},
	})
	load.WaitMore(t, 50)

	// 50:50: both answer. 200 requests all to one side would happen
	// with probability 2^-199: the split did not apply.
	snap.RawRoutes["web"] = routes(50, 50)
	cp.set(snap)
	deadline := time.Now().Add(xdsWaitTimeout)
	seen := map[string]int{}
	for seen["A\n"] == 0 || seen["B\n"] == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("50:50: answers %v after %s, want both backends", seen, xdsWaitTimeout)
		}
		body, err := bodyFrom(client, web)
		if err != nil {
			t.Fatalf("during the move: %v", err)
		}
		seen[body]++
	}
	load.WaitMore(t, 50)

	snap.RawRoutes["web"] = routes(0, 100)
	cp.set(snap)
	// Applied once 40 answers in a row are B (2^-40 at 50:50); then
	// every answer is.
	deadline = time.Now().Add(xdsWaitTimeout)
	for inRow := 0; inRow < 40; {
		if time.Now().After(deadline) {
			t.Fatalf("0:100: still not all B after %s", xdsWaitTimeout)
		}
		body, err := bodyFrom(client, web)
		if err != nil {
			t.Fatalf("during the move: %v", err)
		}
		inRow++
		if body != "B\n" {
			inRow = 0
		}
	}
	load.WaitMore(t, 50)
	for range 20 {
		if body, err := bodyFrom(client, web); err != nil || body != "B\n" {
			t.Fatalf("at 0:100: %q, %v; want B", body, err)
		}
	}
	load.WaitMore(t, 50)

	res := load.Stop()
	if res.Failed() != 0 || res.OK() == 0 {
		t.Fatalf("load over the split's moves: %v\nproxy log:\n%s", res, g.Stderr())
	}
	t.Logf("%s: %v", protocol, res)
}
