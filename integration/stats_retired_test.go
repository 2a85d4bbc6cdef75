package integration

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestStatsRetiredAfterAListenerIsRemoved hot restarts a proxy into a
// config without one of its listeners. Once the old generation is gone,
// that listener's stats are retired: `hotproxy stats` and `hotproxy top`
// no longer show them (stats says how many it hid), --all shows them
// marked, with the requests they counted, and --retired shows only them.
func TestStatsRetiredAfterAListenerIsRemoved(t *testing.T) {
	t.Parallel()
	direct := []harness.Route{{Prefix: "/", Status: 200, Body: "ok\n"}}
	both := harness.Config{Concurrency: 1, DrainTime: "1s", Extra: "[hot_restart]\ncommit_window = \"100ms\"\n",
		Listeners: []harness.Listener{{Name: "web", Routes: direct}, {Name: "old", Routes: direct}}}.Allocate(t)
	webOnly := both
	webOnly.Listeners = both.Listeners[:1]
	region := harness.StatsPath(t)
	baseID := harness.UniqueBaseID()

	g0 := harness.StartGeneration(t, harness.WriteConfig(t, both.TOML()), baseID, 0, harness.LaunchOptions{})
	if err := g0.WaitReadyFD(15 * time.Second); err != nil {
		t.Fatalf("epoch 0: %v\n%s", err, g0.Output())
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	for range 3 {
		resp, err := c.Get("http://" + both.Listeners[1].Address + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	waitCLICounter(t, region, "listener.old.downstream_rq_total", 3, 5*time.Second)

	g1 := harness.StartGeneration(t, harness.WriteConfig(t, webOnly.TOML()), baseID, 1, harness.LaunchOptions{})
	if err := g1.WaitReadyFD(15 * time.Second); err != nil {
		t.Fatalf("epoch 1: %v\n%s", err, g1.Output())
	}
	if _, err := g0.Wait(15 * time.Second); err != nil {
		t.Fatalf("epoch 0 did not exit after the hand-over: %v", err)
	}

	res := statsCLI(t, 0, "--path", region, "--filter", `^listener\.`)
	if strings.Contains(res.Stdout, "listener.old.") {
		t.Errorf("the removed listener's stats are shown by default:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "listener.web.downstream_rq_total: ") {
		t.Errorf("the current listener's stats are missing:\n%s", res.Stdout)
	}
	if !regexp.MustCompile(`\d+ retired stats not shown .*--all`).MatchString(res.Stderr) {
		t.Errorf("no note of the hidden stats on stderr: %q", res.Stderr)
	}
	res = statsCLI(t, 0, "--path", region, "--all", "--filter", `^listener\.old\.downstream_rq_total$`)
	if res.Stdout != "listener.old.downstream_rq_total: 3 (retired)\n" {
		t.Errorf("--all: %q, want the old listener's 3 requests, marked retired", res.Stdout)
	}
	res = statsCLI(t, 0, "--path", region, "--retired", "--filter", `^listener\.`)
	if !strings.Contains(res.Stdout, "listener.old.downstream_rq_total: 3\n") || strings.Contains(res.Stdout, "listener.web.") {
		t.Errorf("--retired: want the old listener's stats only:\n%s", res.Stdout)
	}
	top := harness.Run(t, "top", "--path", region, "--frames", "1", "--size", "120x30")
	if top.Code != 0 || !regexp.MustCompile(`(?m)^web `).MatchString(top.Stdout) || regexp.MustCompile(`(?m)^old `).MatchString(top.Stdout) {
		t.Errorf("hotproxy top (exit %d): want a row for web and none for the removed old:\n%s%s", top.Code, top.Stdout, top.Stderr)
	}
}
