package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// container is one `hotproxy serve` generation in its own mount and PID
// namespaces (unshare --mount --pid --fork --mount-proc), sharing the
// network and IPC namespaces (and /dev/shm) with the test: two containers
// of one pod.
type container struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startContainer(t *testing.T, unshare, bin, cfg string, baseID, epoch int) (*container, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("epoch%d.log", epoch))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c := &container{done: make(chan struct{}), log: logPath}
	c.cmd = exec.Command(unshare, "--mount", "--pid", "--fork", "--mount-proc", "--kill-child",
		bin, "serve", "-c", cfg, "--base-id", fmt.Sprint(baseID), "--restart-epoch", fmt.Sprint(epoch), "--ready-fd", "3")
	c.cmd.ExtraFiles = []*os.File{w}
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() { c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		// The generation is PID 1 of its namespace: killing it (the only
		// child of unshare) ends the namespace.
		for _, k := range childrenOf(t, c.cmd.Process.Pid) {
			syscall.Kill(k, syscall.SIGKILL)
		}
		c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			b, _ := os.ReadFile(c.log)
			t.Logf("epoch %d output:\n%s", epoch, b)
		}
	})
	r.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && line == "" {
		b, _ := os.ReadFile(c.log)
		t.Fatalf("epoch %d: no readiness line: %v\n%s", epoch, err, b)
	}
	return c, strings.TrimSpace(line)
}

// adminCounter reads a counter from GET /stats?format=json.
func adminCounter(admin, name string) (uint64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + admin + "/stats?format=json")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var doc struct {
		Stats []struct {
			Name    string  `json:"name"`
			Counter *uint64 `json:"counter"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return 0, fmt.Errorf("/stats: %w", err)
	}
	for _, s := range doc.Stats {
		if s.Name == name && s.Counter != nil {
			return *s.Counter, nil
		}
	}
	return 0, fmt.Errorf("/stats has no counter %s", name)
}

// TestHandOverAcrossContainers: generation 0 in one "container", generation
// 1 in another that shares only the network and IPC namespaces (and
// /dev/shm) with it. The abstract restart socket and the stats region are
// reachable across them: the hand-over works under load without a failed
// request, generation 0 exits by itself, and the request counter carries
// on from where generation 0 left it.
func TestHandOverAcrossContainers(t *testing.T) {
	requireRoot(t, "mount and PID namespaces")
	unshare := requireUnshare(t)
	requireServeContract(t)
	bin := harness.Binary(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "hotproxy.toml")
	if err := os.WriteFile(cfg, []byte(c.TOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	superviseBase++
	base := superviseBase
	t.Cleanup(func() { os.Remove(fmt.Sprintf("/dev/shm/hotproxy.%d.stats", base)) })

	gen0, line := startContainer(t, unshare, bin, cfg, base, 0)
	if !strings.HasPrefix(line, "READY") {
		t.Fatalf("epoch 0: %q", line)
	}
	url := "http://" + c.Listeners[0].Address + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: 4, Duration: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(500, 10*time.Second) {
			t.Fatalf("%v load did not start", mode)
		}
		runs = append(runs, r)
	}
	before, err := adminCounter(c.Admin, "listener.web.downstream_rq_total")
	if err != nil {
		t.Fatal(err)
	}

	_, line = startContainer(t, unshare, bin, cfg, base, 1)
	if !strings.HasPrefix(line, "READY") {
		t.Fatalf("epoch 1 in the second container: %q", line)
	}
	select {
	case <-gen0.done:
		if code := gen0.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("epoch 0 exited with %d after the hand-over, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("epoch 0 did not exit within 30s of the hand-over")
	}
	var total, clients int64
	for i, r := range runs {
		clients += 4
		r.WaitTotal(r.Snapshot().Total()+200, 10*time.Second)
		res := r.Stop()
		total += res.OK()
		t.Logf("load %d: %v", i, res)
		if res.Failed() != 0 {
			t.Errorf("load %d: %d failed requests: %v", i, res.Failed(), res)
		}
	}
	// Every request was counted once, by one generation or the other; a
	// request in flight when a load run stopped is counted by the proxy,
	// not by the load generator: at most one per client.
	deadline := time.Now().Add(15 * time.Second)
	var after uint64
	for time.Now().Before(deadline) {
		after, err = adminCounter(c.Admin, "listener.web.downstream_rq_total")
		if err == nil && after >= uint64(total) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("downstream_rq_total: %d before the hand-over, %d after; %d requests answered", before, after, total)
	if before == 0 || after < uint64(total) || after > uint64(total+clients) {
		t.Errorf("listener.web.downstream_rq_total = %d after the hand-over (%d before), want %d (every request) to %d (and those in flight at the end)", after, before, total, total+clients)
	}
}

// TestSupervisorTakeOverAcrossContainers: the pod-upgrade pattern with
// supervisors. Container A runs `hotproxy supervise`; container B (sharing
// only the network and IPC namespaces and /dev/shm) runs `hotproxy
// supervise --take-over`, whose first generation takes over from A's. A's
// generation drains and exits 0, and A's supervisor, with nothing left to
// run, exits 0 too. Under load, not one request fails.
func TestSupervisorTakeOverAcrossContainers(t *testing.T) {
	requireRoot(t, "mount and PID namespaces")
	unshare := requireUnshare(t)
	requireServeContract(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	wrap := []string{unshare, "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"}
	a := startSupervised(t, supervisedOpts{Config: c.TOML(), Wrap: wrap})
	t.Cleanup(func() { os.Remove(fmt.Sprintf("/dev/shm/hotproxy.%d.stats", a.baseID)) })
	if st := a.mustStatus(); st.PID != 1 || st.ServingEpoch != 0 {
		t.Fatalf("container A: %+v", st)
	}
	url := "http://" + c.Listeners[0].Address + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: 4, Duration: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(300, 10*time.Second) {
			t.Fatalf("%v load did not start", mode)
		}
		runs = append(runs, r)
	}
	b := startSupervised(t, supervisedOpts{Config: c.TOML(), Wrap: wrap, BaseID: a.baseID, Args: []string{"--take-over"}})
	st := b.mustStatus()
	if g, ok := st.Serving(); !ok || g.Epoch != 1 {
		t.Fatalf("container B: %+v", st)
	}
	select {
	case <-a.done:
		if code := a.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("container A's supervisor exited %d, want 0\n%s", code, a.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("container A's supervisor still runs 30s after the hand-over\n%s", a.out.String())
	}
	if res := b.cli("reload"); res.Code != 0 || !strings.Contains(res.Stdout, "epoch 2 serves") {
		t.Fatalf("reload in container B: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	for i, r := range runs {
		r.WaitTotal(r.Snapshot().Total()+200, 10*time.Second)
		res := r.Stop()
		t.Logf("load %d: %v", i, res)
		if res.Failed() != 0 {
			t.Errorf("load %d: %d failed requests: %v", i, res.Failed(), res)
		}
	}
	if code := b.stop(30 * time.Second); code != 0 {
		t.Fatalf("container B's supervisor exit status %d\n%s", code, b.out.String())
	}
}
