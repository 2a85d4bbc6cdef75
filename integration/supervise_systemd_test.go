package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// installedPath is where the unit expects the binary.
const installedPath = "/usr/local/bin/hotproxy"

// TestSystemdUnitVerifies runs `systemd-analyze verify` on
// systemd/hotproxy.service (with ExecStart pointing at the binary under
// test, so that the path exists). Any complaint fails the test.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("systemd-analyze not found (Debian: apt-get install systemd): %v", err)
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join(root, "systemd", "hotproxy.service"))
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Binary(t)
	ver := systemdVersion(t, analyze)
	t.Logf("systemd %d", ver)

	verify := func(name, text string, allowed ...string) {
		t.Helper()
		dir := t.TempDir()
		path := filepath.Join(dir, "hotproxy.service")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, installedPath, bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", path).CombinedOutput()
		if err != nil {
			t.Errorf("%s: systemd-analyze verify: %v\n%s", name, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line == "" {
				continue
			}
			ok := false
			for _, a := range allowed {
				ok = ok || strings.Contains(line, a)
			}
			if !ok {
				t.Errorf("%s: systemd-analyze verify complains: %s", name, line)
			} else {
				t.Logf("%s: known on systemd %d: %s", name, ver, line)
			}
		}
	}
	if !strings.Contains(string(unit), "\nType=notify\n") || !strings.Contains(string(unit), "\nExecReload="+installedPath+" reload --wait-commit\n") ||
		!strings.Contains(string(unit), "KillMode=mixed") || !strings.Contains(string(unit), "RuntimeDirectory=hotproxy") ||
		strings.Contains(string(unit), "PrivateNetwork=yes") {
		t.Errorf("hotproxy.service lacks Type=notify, ExecReload=%s reload --wait-commit, KillMode=mixed or RuntimeDirectory=hotproxy, or has PrivateNetwork", installedPath)
	}
	verify("hotproxy.service", string(unit))
}

func systemdVersion(t *testing.T, analyze string) int {
	out, err := exec.Command(analyze, "--version").Output()
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	m := regexp.MustCompile(`systemd (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze --version: %q", out)
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}
