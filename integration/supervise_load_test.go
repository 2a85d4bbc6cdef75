package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// buildVersion builds cmd/hotproxy with version string v into dir.
func buildVersion(t *testing.T, v, dir string) string {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "hotproxy-"+v)
	ctx, cancel := context.WithTimeout(context.Background(), harness.DefaultBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X github.com/hotproxy/hotproxy/internal/version.Version="+v, "-o", out, "./cmd/hotproxy")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", v, err, b)
	}
	return out
}

// supervisedProxyConfig is one HTTP listener to backend, with short drain
// bounds and commit window so that reloads follow each other quickly.
func supervisedProxyConfig(t *testing.T, backend string) harness.Config {
	c := httpProxyConfig(backend)
	c.DrainTime = "2s"
	c.ParentShutdownTime = "3s"
	c.Extra = "[hot_restart]\ncommit_window = \"300ms\"\n"
	return c.Allocate(t)
}

// TestSuperviseUnderLoad drives the real binary through everything an
// operator does, under continuous load in keep-alive and
// connection-per-request modes: 20 reloads through `hotproxy reload`, a
// reload with a broken config (refused, the old generation serves on), a
// swap to a binary with another version through scripts/hot-swap.sh (which
// also re-executes the supervisor), an explicit `reload --supervisor`, and
// a last reload. Not one request may fail, and the supervisor's pid never
// changes.
func TestSuperviseUnderLoad(t *testing.T) {
	requireServeContract(t)
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	next := buildVersion(t, "v-next", t.TempDir())
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	supPID := s.cmd.Process.Pid
	url := "http://" + c.Listeners[0].Address + "/"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: 4, Duration: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(100, 10*time.Second) {
			t.Fatalf("%v load did not start: %v", mode, r.Snapshot())
		}
		runs = append(runs, r)
	}

	fdsBefore := fdCount(t, supPID)
	start := time.Now()
	for i := 1; i <= 20; i++ {
		res := s.cli("reload")
		if res.Code != 0 || !strings.Contains(res.Stdout, fmt.Sprintf("epoch %d serves", i)) {
			t.Fatalf("reload %d: exit %d\n%s%s", i, res.Code, res.Stdout, res.Stderr)
		}
	}
	t.Logf("20 reloads in %v", time.Since(start).Round(time.Millisecond))
	// Each live generation has a link to the supervisor (the kept
	// listening sockets): count once the draining ones have exited.
	s.waitGenerations(1, 30*time.Second)
	if fdsAfter := fdCount(t, supPID); fdsAfter != fdsBefore {
		t.Errorf("supervisor fds: %d before 20 reloads, %d after", fdsBefore, fdsAfter)
	}

	// A broken config: refused with the reason, epoch 20 serves on.
	good, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.cfgPath, append(append([]byte{}, good...), "\n[[listeners]\nname = \n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	res := s.cli("reload")
	if res.Code == 0 {
		t.Fatalf("reload with a broken config exited 0:\n%s", res.Stdout)
	}
	wantContains(t, "hotproxy reload with a broken config", res.Stderr, "epoch 21 failed", s.cfgPath, "epoch 20 still serves")
	if st := s.mustStatus(); st.ServingEpoch != 20 || st.FailedReloads != 1 {
		t.Fatalf("after the broken reload: serving epoch %d, %d failed reloads", st.ServingEpoch, st.FailedReloads)
	}
	if err := os.WriteFile(s.cfgPath, good, 0o644); err != nil {
		t.Fatal(err)
	}

	// A new binary: installed atomically, generation reloaded from it,
	// supervisor re-executed from it.
	swap := exec.Command(filepath.Join(root, "scripts", "hot-swap.sh"), next, "--control-socket", s.ctl)
	swap.Env = append(os.Environ(), "HOTPROXY_INSTALL_PATH="+s.bin)
	out, err := swap.CombinedOutput()
	if err != nil {
		t.Fatalf("hot-swap.sh: %v\n%s", err, out)
	}
	wantContains(t, "hot-swap.sh", string(out), "installed hotproxy v-next", "epoch 21 serves", fmt.Sprintf("re-executed in place: pid %d, version v-next", supPID))
	st := s.statusJSON()
	g, ok := st.Serving()
	if !ok || g.Epoch != 21 || g.Version != "v-next" || st.Version != "v-next" || st.PID != supPID || st.Reexecs != 1 {
		t.Fatalf("after the swap: %+v", st)
	}
	text := s.cli("status")
	wantContains(t, "hotproxy status", text.Stdout, "version v-next", "serving", "v-next")

	// The verb itself, and a reload after it.
	res = s.cli("reload", "--supervisor")
	if res.Code != 0 || !strings.Contains(res.Stdout, fmt.Sprintf("pid %d", supPID)) {
		t.Fatalf("reload --supervisor: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	res = s.cli("reload")
	if res.Code != 0 || !strings.Contains(res.Stdout, "epoch 22 serves") {
		t.Fatalf("reload after re-executions: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	st = s.statusJSON()
	if st.PID != supPID || st.Reexecs != 2 || st.Reloads != 22 {
		t.Fatalf("final status: %+v", st)
	}
	if s.supervisorPID() != supPID || s.exited() {
		t.Fatalf("supervisor pid changed or it exited")
	}

	for i, r := range runs {
		r.WaitTotal(r.Snapshot().Total()+200, 10*time.Second)
		result := r.Stop()
		t.Logf("load %d: %v", i, result)
		if result.Failed() != 0 {
			t.Errorf("load %d: %d failed requests: %v", i, result.Failed(), result)
		}
	}
	if code := s.stop(30 * time.Second); code != 0 {
		t.Fatalf("supervisor exit status %d\n%s", code, s.out.String())
	}
}

// fdCount counts the open fds of pid.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
