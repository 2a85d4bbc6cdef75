package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// whereUsersGo sends each user's requests, each on a new connection (so
// both workers serve them), and returns the backend each user reached,
// failing if one user reached two.
func whereUsersGo(t *testing.T, url string, users int) map[string]string {
	t.Helper()
	c := newClient(5 * time.Second)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	got := map[string]string{}
	for u := range users {
		user := fmt.Sprintf("user-%d", u)
		for range 4 {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("X-User", user)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", user, err)
			}
			b := make([]byte, 64)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			backend := strings.TrimSpace(string(b[:n]))
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d %q", user, resp.StatusCode, backend)
			}
			if prev, ok := got[user]; ok && prev != backend {
				t.Fatalf("%s reached %s, then %s", user, prev, backend)
			}
			got[user] = backend
		}
	}
	return got
}

// TestHashSameHostAcrossHotRestart: with ring_hash and maglev keyed by a
// header, a user's requests reach the same backend from every worker,
// and still after hot restarts (the hash has no per-process seed).
func TestHashSameHostAcrossHotRestart(t *testing.T) {
	for _, policy := range []string{"ring_hash", "maglev"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			b1, b2, b3 := harness.StartHTTPBackend(t, "b1"), harness.StartHTTPBackend(t, "b2"), harness.StartHTTPBackend(t, "b3")
			cfg := restartConfig("1s", "2s", "100ms", b1.Addr)
			cfg.Clusters[0].Endpoints = []string{b1.Addr, b2.Addr, b3.Addr}
			cfg.Clusters[0].LBPolicy = policy
			// Right after the [[clusters]] table: its key.
			cfg.Extra = "hash_on = \"header:x-user\"\n\n" + cfg.Extra
			c := startChain(t, cfg)
			before := whereUsersGo(t, c.serving.URL("web", "/"), 24)
			spread := map[string]bool{}
			for _, b := range before {
				spread[b] = true
			}
			if len(spread) < 2 {
				t.Fatalf("24 users all reached %v: the test proves nothing", spread)
			}
			for i := 1; i <= 2; i++ {
				child, parent := c.restart()
				waitExit0(t, parent, exitTimeout)
				after := whereUsersGo(t, child.URL("web", "/"), 24)
				for user, b := range before {
					if after[user] != b {
						t.Errorf("restart %d: %s moved from %s to %s", i, user, b, after[user])
					}
				}
			}
		})
	}
}
