package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// hotSwap runs scripts/hot-swap.sh with env (and without an inherited
// HOTPROXY_INSTALL_PATH) and returns its output and exit status.
func hotSwap(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "hot-swap.sh"), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOTPROXY_INSTALL_PATH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil {
		t.Fatalf("hot-swap.sh: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// TestHotSwapInstallsWhereTheSupervisorLooks: the README's
// `scripts/hot-swap.sh NEW_BINARY` after `bin/hotproxy supervise` used to
// install at /usr/local/bin/hotproxy, print "installed", exit 0 and leave
// the old version serving. Now an install path that is not the running
// supervisor's generation binary is refused, loudly, with nothing
// installed; without one, the script installs at the supervisor's path and
// exits 0 only once the new version serves.
func TestHotSwapInstallsWhereTheSupervisorLooks(t *testing.T) {
	requireServeContract(t)
	t.Parallel()
	next := buildVersion(t, "v-swapped", t.TempDir())
	backend := harness.StartHTTPBackend(t, "b1")
	s := startSupervised(t, supervisedOpts{Config: supervisedProxyConfig(t, backend.Addr).TOML()})
	before, err := os.ReadFile(s.bin)
	if err != nil {
		t.Fatal(err)
	}

	elsewhere := filepath.Join(t.TempDir(), "hotproxy")
	out, rc := hotSwap(t, []string{"HOTPROXY_INSTALL_PATH=" + elsewhere}, next, "--control-socket", s.ctl)
	if rc == 0 || !strings.Contains(out, "NOT INSTALLED") || !strings.Contains(out, s.bin) {
		t.Fatalf("hot-swap.sh with HOTPROXY_INSTALL_PATH=%s (not where the supervisor looks): exit %d, want 1 saying NOT INSTALLED and naming %s:\n%s", elsewhere, rc, s.bin, out)
	}
	if _, err := os.Stat(elsewhere); !os.IsNotExist(err) {
		t.Errorf("%s was written although the script refused: %v", elsewhere, err)
	}
	if now, _ := os.ReadFile(s.bin); !bytes.Equal(now, before) {
		t.Errorf("%s changed although the script refused", s.bin)
	}
	if g, ok := s.mustStatus().Serving(); !ok || g.Version == "v-swapped" {
		t.Fatalf("after a refused swap: serving %+v", g)
	}

	out, rc = hotSwap(t, nil, next, "--control-socket", s.ctl)
	if rc != 0 {
		t.Fatalf("hot-swap.sh: exit %d\n%s", rc, out)
	}
	wantContains(t, "hot-swap.sh", out, "installed hotproxy v-swapped at "+s.bin, "serves")
	st := s.statusJSON()
	if g, ok := st.Serving(); !ok || g.Version != "v-swapped" || st.Version != "v-swapped" {
		t.Fatalf("after the swap: %+v", st)
	}
}
