package workers

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

// TestAccessLogFullDiskCountsDropped (issue 20, item 10): an access log on
// a full tmpfs loses every line to ENOSPC; each one is counted in the
// listener's access_log.dropped, as a line a full queue drops is.
func TestAccessLogFullDiskCountsDropped(t *testing.T) {
	dir := safefiletest.FullTmpfs(t, 64<<10, "access.log")
	lst := httpListener("web", config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: "ok"}})
	lst.AccessLog = []config.AccessLog{{Path: filepath.Join(dir, "access.log"), Format: config.AccessLogJSON}}
	m := startManager(t, &config.Config{Listeners: []config.Listener{lst}}, 1)
	c := newClient(t)
	const n = 30
	for i := range n {
		if resp, _ := get(t, c, "http://"+addr(t, m, "web")+"/"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	waitFor(t, 10*time.Second, "access_log.dropped = 30", func() bool { return lstat(m, statAccessLogDropped) == n })
}
