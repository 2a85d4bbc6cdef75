package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// unitCommand returns the command line of key (ExecStart, ExecReload) in
// systemd/hotproxy.service, with the installed path replaced by bin.
func unitCommand(t *testing.T, key, bin string) []string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join(root, "systemd", "hotproxy.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			args := strings.Fields(v)
			if args[0] != installedPath {
				t.Fatalf("%s runs %s, want %s", key, args[0], installedPath)
			}
			args[0] = bin
			return args
		}
	}
	t.Fatalf("systemd/hotproxy.service has no %s=", key)
	return nil
}

// TestSystemdReloadTellsTheTruth runs the unit's ExecReload= as systemd
// does for `systemctl reload` (the unit's RUNTIME_DIRECTORY in its
// environment; --base-id added to ExecStart and ExecReload alike, as a
// drop-in would, so that the test keeps clear of base-id 0) and checks
// what systemd would conclude from its exit status: success for a reload
// whose generation serves through its commit window, failure for a broken
// config, and failure for a generation that dies within its commit window
// (rolled back: the previous one serves again).
func TestSystemdReloadTellsTheTruth(t *testing.T) {
	requireServeContract(t)
	runtimeDir := t.TempDir()
	backend := harness.StartHTTPBackend(t, "b1")
	c := httpProxyConfig(backend.Addr)
	c.DrainTime, c.ParentShutdownTime = "2s", "3s"
	c.Extra = "[hot_restart]\ncommit_window = \"3s\"\n"
	c = c.Allocate(t)
	superviseBase++
	baseID := superviseBase
	start := unitCommand(t, "ExecStart", "bin")
	if len(start) < 2 || start[1] != "supervise" {
		t.Fatalf("ExecStart=%v does not run the supervisor", start)
	}
	s := startSupervised(t, supervisedOpts{
		Config: c.TOML(), BaseID: baseID, Env: []string{"RUNTIME_DIRECTORY=" + runtimeDir},
		ControlSocket: filepath.Join(runtimeDir, fmt.Sprintf("hotproxy.%d.sock", baseID)),
	})
	reload := append(unitCommand(t, "ExecReload", s.bin), "--base-id", fmt.Sprint(baseID))
	systemctlReload := func() (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, reload[0], reload[1:]...)
		cmd.Env = append(os.Environ(), "RUNTIME_DIRECTORY="+runtimeDir, fmt.Sprintf("MAINPID=%d", s.supervisorPID()))
		out, _ := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("ExecReload did not finish within a minute:\n%s", out)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}

	// A good reload: succeeds once epoch 1 has served for the window.
	began := time.Now()
	code, out := systemctlReload()
	if code != 0 || !strings.Contains(out, "epoch 1 serves") || !strings.Contains(out, "committed") {
		t.Fatalf("good reload: exit %d\n%s", code, out)
	}
	if took := time.Since(began); took < 3*time.Second {
		t.Errorf("the reload returned after %v, before the 3s commit window", took)
	}

	// A broken config: fails.
	good, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(s.cfgPath, []byte("[server]\nconcurrency = \"two\"\n"), 0o644)
	if code, out := systemctlReload(); code == 0 || !strings.Contains(out, "epoch 2 failed") {
		t.Fatalf("reload with a broken config: exit %d\n%s", code, out)
	}
	os.WriteFile(s.cfgPath, good, 0o644)

	// A generation that dies within its commit window: fails, and the
	// previous generation serves again.
	type outcome struct {
		code int
		out  string
	}
	done := make(chan outcome, 1)
	go func() {
		code, out := systemctlReload()
		done <- outcome{code, out}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := s.mustStatus()
		if g, ok := st.Serving(); ok && g.Epoch == 2 {
			if err := syscall.Kill(g.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch 2 never served: %+v", st.Generations)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res := <-done
	if res.code == 0 || !strings.Contains(res.out, "died within its commit window") || !strings.Contains(res.out, "rolled back to epoch 1") {
		t.Fatalf("reload whose generation died within its commit window: exit %d\n%s", res.code, res.out)
	}
	if st := s.mustStatus(); st.ServingEpoch != 1 {
		t.Fatalf("after the rollback: serving epoch %d, want 1", st.ServingEpoch)
	}
}
