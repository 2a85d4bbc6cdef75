package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

// TestServeRefusesPlantedSymlinks (issue 20, item 2): root's `serve`, with
// its stats region, its process log or an access log at a path where
// nobody planted a symbolic link (in a world-writable directory without
// the sticky bit, so fs.protected_symlinks would not help), stops before
// serving with an error that names the path, and never creates the file
// the link points at.
func TestServeRefusesPlantedSymlinks(t *testing.T) {
	safefiletest.RequireRoot(t)
	for _, tc := range []struct {
		name  string
		extra func(path string) string
	}{
		{"stats region", func(p string) string { return fmt.Sprintf("[stats]\npath = %q\n", p) }},
		{"process log", func(p string) string { return fmt.Sprintf("[log]\npath = %q\n", p) }},
		{"access log", func(p string) string { return fmt.Sprintf("[[listeners.access_log]]\npath = %q\n", p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			link := filepath.Join(safefiletest.SharedDir(t), "planted")
			target := safefiletest.PrivateTarget(t)
			safefiletest.Symlink(t, target, link)
			cfg := directConfig()
			cfg.Extra = tc.extra(link)
			reg := newStatsRegion(t) // a base-id of its own
			p := harness.Launch(t, cfg.Allocate(t).TOML(), reg.args()...)
			code, err := p.Wait(harness.DefaultReadyTimeout)
			if err != nil {
				t.Fatalf("serve kept running with a planted link: %v\n%s", err, p.Output())
			}
			if code == 0 {
				t.Fatalf("serve exited 0 with a planted link:\n%s", p.Output())
			}
			if !strings.Contains(p.Stderr(), link) || !strings.Contains(p.Stderr(), "symbolic link") {
				t.Errorf("serve's error does not name %s as a symbolic link:\n%s", link, p.Stderr())
			}
			if n := safefiletest.Size(t, target); n != -1 {
				t.Errorf("the link's target was created (%d bytes)", n)
			}
		})
	}
}
