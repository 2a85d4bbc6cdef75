package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/shm"
)

// dockerHealthcheck returns the shell command of the Dockerfile's
// HEALTHCHECK (its CMD, continuation lines joined).
func dockerHealthcheck(t *testing.T) string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.ReplaceAll(string(data), "\\\n", " ")
	m := regexp.MustCompile(`(?m)^HEALTHCHECK .*?\bCMD\s+(.*)$`).FindStringSubmatch(joined)
	if m == nil {
		t.Fatal("no HEALTHCHECK ... CMD line in the Dockerfile")
	}
	return strings.TrimSpace(m[1])
}

// runHealthcheck runs the Dockerfile's HEALTHCHECK command as Docker
// would: the shell form with sh -c, the binary under test first on PATH;
// the exec form (a JSON array) directly, /usr/local/bin/hotproxy being the
// binary under test. The image's config path is replaced by cfg, and
// HOTPROXY_BASE_ID is baseID (the image's environment names the
// instance). It returns the exit status.
func runHealthcheck(t *testing.T, cmdline, cfg string, baseID int) int {
	t.Helper()
	bin := harness.Binary(t)
	bindir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(bindir, "hotproxy")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	cmdline = strings.ReplaceAll(cmdline, "/etc/hotproxy/hotproxy.toml", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if strings.HasPrefix(cmdline, "[") {
		var argv []string
		if err := json.Unmarshal([]byte(cmdline), &argv); err != nil || len(argv) == 0 {
			t.Fatalf("HEALTHCHECK exec form %q: %v", cmdline, err)
		}
		if argv[0] == "/usr/local/bin/hotproxy" || argv[0] == "hotproxy" {
			argv[0] = bin
		}
		cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	} else {
		cmd = exec.CommandContext(ctx, "sh", "-c", cmdline)
	}
	cmd.Env = append(os.Environ(), "PATH="+bindir+":"+os.Getenv("PATH"), fmt.Sprintf("HOTPROXY_BASE_ID=%d", baseID))
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil {
		t.Fatalf("healthcheck %q: %v", cmdline, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("healthcheck %q did not finish within 10s: %s", cmdline, out)
	}
	return cmd.ProcessState.ExitCode()
}

// TestKilledGenerationReadsDead SIGKILLs the only generation of an
// instance: nobody folds its owner entry, which still says live with
// server.live 1. Within a second of its death `stats` (text, --owners,
// json, ndjson, prometheus), `top` and the image's HEALTHCHECK command all say
// it is dead, because they ask the kernel (its owner lock is free), not
// the numbers it left behind.
func TestKilledGenerationReadsDead(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	// As in the image: no [stats] path, the base-id names the region.
	c := httpProxyConfig(b.Addr)
	c.Extra = "[stats]\nflush_interval = \"1s\"\n"
	id := harness.UniqueBaseID()
	region := shm.DefaultPath(uint64(id))
	t.Cleanup(func() { os.Remove(region) })
	p := harness.StartProxy(t, c.Allocate(t).TOML(), "--base-id", strconv.Itoa(id))
	sendRequests(t, p, 5)
	waitCLICounter(t, region, "listener.web.downstream_rq_total", 5, 5*time.Second)

	health := dockerHealthcheck(t)
	if rc := runHealthcheck(t, health, p.ConfigPath, id); rc != 0 {
		t.Fatalf("HEALTHCHECK %q on a live proxy: exit %d, want 0", health, rc)
	}
	if res := statsCLI(t, 0, "--path", region, "--filter", `^server\.live$`); res.Stdout != "server.live: 1\n" {
		t.Fatalf("live proxy: %q, want server.live: 1", res.Stdout)
	}

	p.Signal(syscall.SIGKILL)
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not die of SIGKILL within 10s")
	}
	killed := time.Now()
	pid := fmt.Sprint(p.PID())

	type check struct {
		name string
		run  func() error
	}
	checks := []check{
		{"stats text", func() error {
			res := harness.Run(t, "stats", "--path", region, "--filter", `^server\.live$`)
			if res.Stdout != "server.live: 0\n" {
				return fmt.Errorf("printed %q, want server.live: 0 (exit %d, %s)", res.Stdout, res.Code, res.Stderr)
			}
			return nil
		}},
		{"stats --owners", func() error {
			res := harness.Run(t, "stats", "--path", region, "--owners", "--filter", `^server\.live$`)
			if !regexp.MustCompile(`(?m)^\d+\s+` + pid + `\s+\d+\s+dead\s`).MatchString(res.Stdout) {
				return fmt.Errorf("owner table does not show pid %s dead:\n%s", pid, res.Stdout)
			}
			return nil
		}},
		{"stats json", func() error {
			res := harness.Run(t, "stats", "--path", region, "--format", "json", "--filter", `^server\.live$`)
			var doc struct {
				Owners []struct {
					PID   int    `json:"pid"`
					State string `json:"state"`
				} `json:"owners"`
			}
			if err := json.Unmarshal([]byte(res.Stdout), &doc); err != nil {
				return fmt.Errorf("%v:\n%s", err, res.Stdout)
			}
			if len(doc.Owners) != 1 || fmt.Sprint(doc.Owners[0].PID) != pid || doc.Owners[0].State != "dead" {
				return fmt.Errorf("json owners %+v, want pid %s dead", doc.Owners, pid)
			}
			return nil
		}},
		{"stats prometheus", func() error {
			res := harness.Run(t, "stats", "--path", region, "--format", "prometheus", "--owners")
			for _, want := range []string{"\nhotproxy_server_live 0\n", "pid=" + pid + " epoch=0 state=dead",
				`hotproxy_generation_alive{epoch="0",pid="` + pid + `",slot="0"} 0` + "\n"} {
				if !strings.Contains(res.Stdout, want) {
					return fmt.Errorf("scrape has no %q:\n%s", want, res.Stdout)
				}
			}
			return nil
		}},
		{"stats ndjson", func() error {
			// --watch runs until interrupted: its first line, then Ctrl-C.
			cmd := exec.Command(harness.Binary(t), "stats", "--path", region, "--watch", "100ms", "--format", "ndjson", "--filter", `^server\.live$`)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				return err
			}
			if err := cmd.Start(); err != nil {
				return err
			}
			defer func() {
				cmd.Process.Signal(os.Interrupt) // the process this check started
				cmd.Wait()
			}()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				return fmt.Errorf("no ndjson line: %v", err)
			}
			var doc struct {
				Owners []struct {
					PID   int    `json:"pid"`
					State string `json:"state"`
				} `json:"owners"`
			}
			if err := json.Unmarshal([]byte(line), &doc); err != nil {
				return fmt.Errorf("%v:\n%s", err, line)
			}
			if len(doc.Owners) != 1 || fmt.Sprint(doc.Owners[0].PID) != pid || doc.Owners[0].State != "dead" {
				return fmt.Errorf("ndjson owners %+v, want pid %s dead", doc.Owners, pid)
			}
			return nil
		}},
		{"top", func() error {
			res := harness.Run(t, "top", "--path", region, "--frames", "1", "--size", "120x40")
			if !regexp.MustCompile(`(?m)^\d+\s+\d+\s+` + pid + `\s+dead\s`).MatchString(res.Stdout) {
				return fmt.Errorf("top does not show pid %s dead:\n%s", pid, res.Stdout)
			}
			return nil
		}},
		{"HEALTHCHECK", func() error {
			if rc := runHealthcheck(t, health, p.ConfigPath, id); rc == 0 {
				return fmt.Errorf("%q passed (exit 0) on a dead proxy", health)
			}
			return nil
		}},
	}
	errs := make(chan error, len(checks))
	for _, c := range checks {
		go func() {
			err := c.run()
			if took := time.Since(killed); err == nil && took > time.Second {
				err = fmt.Errorf("said dead only %v after the kill, want within 1s", took.Round(time.Millisecond))
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", c.name, err)
			}
			errs <- err
		}()
	}
	for range checks {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Logf("all %d readers said dead within %v of the SIGKILL", len(checks), time.Since(killed).Round(time.Millisecond))
}
