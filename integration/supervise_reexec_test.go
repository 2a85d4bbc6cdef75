package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestSuperviseFollowsASymlinkFlip: deploy tools (Capistrano and the like)
// install each release in its own directory and flip a `current` symlink.
// A supervisor started as current/hotproxy runs the release current points
// to at each reload, and re-executes itself from it too; status names the
// file and the version each generation runs.
func TestSuperviseFollowsASymlinkFlip(t *testing.T) {
	requireServeContract(t)
	dir := t.TempDir()
	releases := filepath.Join(dir, "releases")
	v1 := installBinary(t, harness.Binary(t), filepath.Join(releases, "1")) // releases/1/bin/hotproxy
	v2dir := filepath.Join(releases, "2", "bin")
	if err := os.MkdirAll(v2dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v2 := filepath.Join(v2dir, "hotproxy")
	if err := os.Rename(buildVersion(t, "v-flipped", t.TempDir()), v2); err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(dir, "current")
	flip := func(target string) {
		t.Helper()
		tmp := current + ".new"
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil { // atomic, as deploy tools do it
			t.Fatal(err)
		}
	}
	flip(filepath.Join(releases, "1"))

	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	s := startSupervised(t, supervisedOpts{Config: c.TOML(), Binary: filepath.Join(current, "bin", "hotproxy")})
	g, _ := s.mustStatus().Serving()
	if g.Binary != v1 || g.Version == "v-flipped" {
		t.Fatalf("epoch 0 runs %s (%s), want %s", g.Binary, g.Version, v1)
	}

	flip(filepath.Join(releases, "2"))
	if res := s.cli("reload"); res.Code != 0 {
		t.Fatalf("reload after the flip: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	g, _ = s.mustStatus().Serving()
	if g.Epoch != 1 || g.Binary != v2 || g.Version != "v-flipped" {
		t.Fatalf("after the flip, epoch %d runs %s (%s), want epoch 1 running %s (v-flipped)", g.Epoch, g.Binary, g.Version, v2)
	}
	if !strings.Contains(s.out.String(), "binary="+v2) || !strings.Contains(s.out.String(), "version=v-flipped") {
		t.Errorf("the supervisor's log does not say which file and version it started:\n%s", s.out.String())
	}

	// The supervisor's own re-execution follows the symlink too.
	if res := s.cli("reload", "--supervisor"); res.Code != 0 || !strings.Contains(res.Stdout, "version v-flipped") {
		t.Fatalf("reload --supervisor after the flip: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
}

// TestSuperviseSurvivesSIGHUPFloodDuringReexec floods the supervisor with
// SIGHUP (and a few SIGUSR1) while it re-executes itself, several times
// over. A SIGHUP that arrived in the execve window used to get its default
// action and kill the supervisor. It must survive every time, keep its
// pid, serve throughout, and account for every generation it ends up with:
// the one serving, the ones draining, nothing it does not list.
func TestSuperviseSurvivesSIGHUPFloodDuringReexec(t *testing.T) {
	requireServeContract(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	supPID := s.supervisorPID()

	for round := range 5 {
		stop := make(chan struct{})
		flooded := make(chan int)
		go func() {
			n := 0
			defer func() { flooded <- n }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sig := syscall.SIGHUP
				if i%10 == 9 {
					sig = syscall.SIGUSR1
				}
				if syscall.Kill(supPID, sig) != nil {
					return
				}
				n++
				time.Sleep(200 * time.Microsecond)
			}
		}()
		res := s.cli("reload", "--supervisor")
		close(stop)
		sent := <-flooded
		if s.exited() {
			t.Fatalf("round %d: the supervisor died during the re-execution (%v) after %d signals\n%s", round, s.cmd.ProcessState, sent, s.out.String())
		}
		if res.Code != 0 {
			t.Fatalf("round %d: reload --supervisor: exit %d\n%s%s", round, res.Code, res.Stdout, res.Stderr)
		}
		t.Logf("round %d: %d signals during the re-execution", round, sent)
	}

	// Let the reloads the flood asked for settle, then account for every
	// generation: what the supervisor lists is exactly its children.
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := s.mustStatus()
		if st.PID != supPID || st.Reexecs != 5 {
			t.Fatalf("supervisor pid %d (want %d), %d re-executions (want 5)", st.PID, supPID, st.Reexecs)
		}
		starting := false
		listed := map[int]bool{}
		for _, g := range st.Generations {
			listed[g.PID] = true
			starting = starting || g.State == "starting"
		}
		kids := childrenOf(t, supPID)
		same := len(kids) == len(listed)
		for _, k := range kids {
			same = same && listed[k]
		}
		if _, ok := st.Serving(); ok && !starting && same {
			t.Logf("after the flood: %d reloads, %d generations: %+v", st.Reloads, len(st.Generations), st.Generations)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("generations not accounted for: listed %+v, children %v", st.Generations, kids)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := s.stop(60 * time.Second); code != 0 {
		t.Fatalf("supervisor exit status %d\n%s", code, s.out.String())
	}
}
