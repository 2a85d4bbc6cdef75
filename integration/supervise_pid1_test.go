package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart/supervisor/supervisortest"
)

// fakeConfig is a valid config for fake generations (they only read it).
const fakeConfig = `[server]
drain_time = "1s"
parent_shutdown_time = "2s"

[hot_restart]
commit_window = "200ms"
handoff_timeout = "3s"
`

// TestSupervisePID1 runs the supervisor as PID 1 of a new PID namespace
// (unshare --pid --fork --mount-proc). Its generations each leave an orphan
// behind (a `sleep` they never wait for), which the kernel re-parents to
// PID 1: after reloads, the supervisor must have no zombie children and
// exactly its live generations; SIGTERM stops everything and it exits 0.
func TestSupervisePID1(t *testing.T) {
	requireRoot(t, "a PID namespace")
	unshare := requireUnshare(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(t.TempDir(), "events")
	s := startSupervised(t, supervisedOpts{
		Config:           fakeConfig,
		GenerationBinary: exe,
		Env:              []string{supervisortest.EnvFake + "=1", supervisortest.EnvOrphan + "=1", supervisortest.EnvEvents + "=" + events},
		Wrap:             []string{unshare, "--pid", "--fork", "--mount-proc", "--kill-child"},
	})
	st := s.mustStatus()
	if st.PID != 1 {
		t.Fatalf("supervisor pid in its namespace = %d, want 1", st.PID)
	}
	for i := 1; i <= 3; i++ {
		res := s.cli("reload")
		if res.Code != 0 || !strings.Contains(res.Stdout, fmt.Sprintf("epoch %d serves", i)) {
			t.Fatalf("reload %d: exit %d\n%s%s", i, res.Code, res.Stdout, res.Stderr)
		}
	}
	// The supervisor's pid as this namespace sees it: unshare's child.
	sup := childrenOf(t, s.cmd.Process.Pid)
	if len(sup) != 1 {
		t.Fatalf("unshare has children %v, want the supervisor alone", sup)
	}
	deadline := time.Now().Add(15 * time.Second)
	var kids, zombies []int
	for time.Now().Before(deadline) {
		st = s.mustStatus()
		kids, zombies = nil, nil
		for _, k := range childrenOf(t, sup[0]) {
			if procState(k) == 'Z' {
				zombies = append(zombies, k)
			} else {
				kids = append(kids, k)
			}
		}
		if len(zombies) == 0 && len(kids) == 1 && len(st.Generations) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(zombies) != 0 || len(kids) != 1 || len(st.Generations) != 1 {
		t.Fatalf("supervisor children %v, zombies %v, generations %+v; want one live child, no zombie", kids, zombies, st.Generations)
	}
	if ev, _ := os.ReadFile(events); strings.Count(string(ev), "ready ") != 4 {
		t.Errorf("events:\n%s", ev)
	}
	if code := s.stop(20 * time.Second); code != 0 {
		t.Fatalf("supervisor (PID 1) exit status %d, want 0\n%s", code, s.out.String())
	}
	if ev, _ := os.ReadFile(events); !strings.Contains(string(ev), "term 3 ") {
		t.Errorf("epoch 3 was not stopped with SIGTERM:\n%s", ev)
	}
}

// childrenOf lists the children of every thread of pid (none when pid is
// gone).
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// procState is the state letter of pid ('?' if it is gone).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return '?'
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2]
	}
	return '?'
}
