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

// shBlockAfter returns the lines of the first ```sh block after the
// heading line heading in a Markdown file.
func shBlockAfter(t *testing.T, md, heading string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(md, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no %q heading", heading)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatalf("no sh block after %q", heading)
	}
	block, _, ok := strings.Cut(rest, "\n```")
	if !ok {
		t.Fatalf("unterminated sh block after %q", heading)
	}
	return strings.Split(block, "\n")
}

// TestSystemdInstallRecipe runs the install recipe of systemd/README.md
// into a temporary root: every path under /etc and /usr/local moved into
// it, the hotproxy user's group replaced by the test's, bin/hotproxy by the
// binary under test. useradd, systemctl and `hotproxy status` are left out
// (they need the real system: the recipe would add a user and start a
// service). The config it installs must validate there, as the recipe
// does, the unit it installs must pass systemd-analyze verify, the file
// its Documentation= names must be installed, and the unit must give the
// service a writable /var/log/hotproxy (LogsDirectory=) under
// ProtectSystem=strict.
func TestSystemdInstallRecipe(t *testing.T) {
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "systemd", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Binary(t)
	dest := t.TempDir()
	gid := strconv.Itoa(os.Getgid())
	// What every Debian root has already.
	for _, d := range []string{"etc/systemd/system", "usr/local/bin", "usr/local/share/doc"} {
		if err := os.MkdirAll(filepath.Join(dest, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Each a pass of its own: the patterns share the blanks around words.
	rewrites := [][2]string{
		{" /etc/", " " + dest + "/etc/"},
		{" /usr/local/", " " + dest + "/usr/local/"},
		{" -g hotproxy ", " -g " + gid + " "},
		{" bin/hotproxy ", " " + bin + " "},
	}
	ran := 0
	for _, line := range shBlockAfter(t, string(md), "## Install") {
		cmd := strings.TrimSpace(line)
		switch {
		case cmd == "":
			continue
		case strings.HasPrefix(cmd, "useradd "), strings.HasPrefix(cmd, "systemctl "), cmd == "hotproxy status":
			t.Logf("left out (needs the real system): %s", cmd)
			continue
		}
		if rest, ok := strings.CutPrefix(cmd, "hotproxy "); ok {
			cmd = dest + "/usr/local/bin/hotproxy " + rest
		}
		cmd = " " + cmd + " "
		for _, r := range rewrites {
			cmd = strings.ReplaceAll(cmd, r[0], r[1])
		}
		c := exec.Command("sh", "-c", cmd)
		c.Dir = root
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("recipe step %q (run as %q): %v\n%s", line, cmd, err, out)
		}
		ran++
	}
	if ran < 5 {
		t.Fatalf("only %d recipe steps ran", ran)
	}
	unitPath := filepath.Join(dest, "etc", "systemd", "system", "hotproxy.service")
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatalf("the recipe installs no unit: %v", err)
	}
	cfg := filepath.Join(dest, "etc", "hotproxy", "hotproxy.toml")
	if res := harness.Run(t, "validate", "-c", cfg); res.Code != 0 {
		t.Errorf("the installed config does not validate:\n%s%s", res.Stdout, res.Stderr)
	}
	docs := regexp.MustCompile(`(?m)^Documentation=(.*)$`).FindStringSubmatch(string(unit))
	if docs == nil {
		t.Error("the unit has no Documentation=")
	}
	for _, d := range strings.Fields(docs[1]) {
		path, ok := strings.CutPrefix(d, "file:")
		if !ok {
			continue
		}
		if _, err := os.Stat(filepath.Join(dest, path)); err != nil {
			t.Errorf("Documentation=%s: the recipe does not install it: %v", d, err)
		}
	}
	if !strings.Contains(string(unit), "\nProtectSystem=strict\n") || !strings.Contains(string(unit), "\nLogsDirectory=hotproxy\n") {
		t.Error("the unit has ProtectSystem=strict without LogsDirectory=hotproxy: /var/log/hotproxy would be read-only")
	}
	if strings.Contains(string(md), "drop-in") {
		t.Error("systemd/README.md mentions a drop-in; there is none")
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("systemd-analyze not found (Debian: apt-get install systemd): the recipe ran and the config validated, the unit was not verified: %v", err)
	}
	// The unit as installed, its binary path moved into the root.
	local := filepath.Join(t.TempDir(), "hotproxy.service")
	if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(unit), installedPath, dest+installedPath)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", local).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("systemd-analyze verify of the installed unit: %v\n%s", err, out)
	}
}
