//go:build linux

package workers

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/workers/steering"
)

// requireSteering skips when the program cannot load and the process is
// not root; as root it must load.
func requireSteering(tb testing.TB) {
	tb.Helper()
	if err := steering.Probe(); err != nil {
		if os.Geteuid() != 0 {
			tb.Skipf("not root, and the eBPF program does not load: %v", err)
		}
		tb.Fatalf("root, but the eBPF program does not load: %v", err)
	}
}

func balanceConfig(balance string) *config.Config {
	cfg := directConfig("ok")
	cfg.Listeners[0].Balance = balance
	return cfg
}

// keepAlive opens a connection to a, gets one response on it (so a worker
// has accepted and counted it) and leaves it open until cleanup.
func keepAlive(tb testing.TB, a string) net.Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", a, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		tb.Fatalf("response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c
}

// workerSpread opens 8 long-lived connections one after another on 4
// workers and returns each worker's accepted connections.
func workerSpread(t *testing.T, balance string) (*Manager, [4]uint64) {
	m := startManager(t, balanceConfig(balance), 4)
	a := addr(t, m, "web")
	for range 8 {
		keepAlive(t, a)
	}
	var got [4]uint64
	for w := range got {
		got[w] = counter(m, fmt.Sprintf("worker.%d.%s", w, statCxTotal))
	}
	return m, got
}

// TestLeastConnSpreadsWorkers: 4 workers, 8 long-lived connections opened
// one after another: least_conn gives every worker 2. The kernel's spread
// is logged for comparison.
func TestLeastConnSpreadsWorkers(t *testing.T) {
	requireSteering(t)
	m, got := workerSpread(t, config.BalanceLeastConn)
	if m.listeners[0].steer == nil {
		t.Fatalf("least_conn listener runs no program: %v", m.listeners[0].steerErr)
	}
	if got != [4]uint64{2, 2, 2, 2} {
		t.Errorf("least_conn: connections per worker %v, want [2 2 2 2]", got)
	}
	_, kernel := workerSpread(t, config.BalanceKernel)
	t.Logf("connections per worker: least_conn %v, kernel %v", got, kernel)
}

// TestLowerConcurrencyLosesNothing is a hot restart from 4 workers to 1 at
// the socket level: connections queued in all four sockets of the old
// generation, which never accepts them; the new generation keeps one
// socket, hands back three (Unused), and the old one closes everything at
// once. Every queued client is served by the new generation: the sockets
// it dropped migrated their queues.
func TestLowerConcurrencyLosesNothing(t *testing.T) {
	requireSteering(t)
	cfg1 := balanceConfig(config.BalanceLeastConn)
	cfg1.SetDefaults()
	snap1, err := BuildSnapshotN(cfg1, Identity{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := New(Options{Concurrency: 4, Logger: testLogger()}, snap1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m1.Close() })
	a := addr(t, m1, "web")
	// Not started: every connection stays queued where the program put
	// it. Hash ties spread them over the four sockets.
	var clients []net.Conn
	for range 32 {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	files, err := m1.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	cfg2 := balanceConfig(config.BalanceLeastConn)
	cfg2.SetDefaults()
	snap2, err := BuildSnapshotN(cfg2, Identity{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := New(Options{Concurrency: 1, Inherited: files, Logger: testLogger()}, snap2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	if n := len(m2.listeners[0].sockets); n != 1 {
		t.Fatalf("the 1-worker generation adopted %d sockets, want 1", n)
	}
	unused := m2.Unused()
	if len(unused) != 3 {
		t.Fatalf("Unused: %d sockets, want the 3 of workers 1-3", len(unused))
	}
	for _, f := range unused {
		f.Close()
	}
	m2.Start()
	m1.Close() // the last descriptors of sockets 1-3: their queues migrate

	for i, c := range clients {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatalf("client %d: write: %v", i, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("client %d of %d: %v (a queued connection was lost)", i, len(clients), err)
		}
		resp.Body.Close()
	}
	if got := lstat(m2, statCxTotal); got != uint64(len(clients)) {
		t.Errorf("the new generation accepted %d, want %d", got, len(clients))
	}
	m2.Close() // counts the last migrations
	migrated := lstat(m2, statBalanceMigrated)
	if migrated == 0 || migrated >= uint64(len(clients)) {
		t.Errorf("balance_migrated = %d, want some but not all of %d (socket 0's queue stays, the others move)", migrated, len(clients))
	}
	t.Logf("%d of %d queued connections migrated from the dropped sockets", migrated, len(clients))
}

// The no-CAP_BPF test re-executes the test binary as uid 65534 (no
// capabilities at all), which builds a least_conn listener and reports.
const noCapChildEnv = "HOTPROXY_TEST_NOCAP_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(noCapChildEnv) == "1" {
		os.Exit(noCapChild())
	}
	os.Exit(m.Run())
}

// noCapChild: what the unprivileged child does; its log goes to stderr.
func noCapChild() int {
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: os.Stderr})
	cfg := balanceConfig(config.BalanceLeastConn)
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot:", err)
		return 2
	}
	m, err := New(Options{Concurrency: 2, Logger: log}, snap)
	if err != nil {
		fmt.Fprintln(os.Stderr, "New:", err)
		return 2
	}
	defer m.Close()
	m.Start()
	if m.listeners[0].steer != nil {
		fmt.Fprintln(os.Stderr, "RESULT: program loaded without privileges")
		return 1
	}
	// Still serves, with the kernel's spread.
	c, err := net.DialTimeout("tcp", m.Addr("web").String(), 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 2
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		fmt.Fprintln(os.Stderr, "request:", err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "RESULT: fallback served")
	return 0
}

// TestFallbackWithoutCapBPF: without CAP_BPF the program refuses to load,
// the listener falls back to the kernel with a log line that names the
// reason and the protection, and it serves.
func TestFallbackWithoutCapBPF(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as uid 65534 (the child drops every capability)")
	}
	// The child must be able to execute a copy of the test binary.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hotproxy-nocap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "workers.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_migrate_req")

	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), noCapChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the child did not finish in 30s; its log:\n%s", stderr.String())
	}
	out := stderr.String()
	if err != nil {
		t.Fatalf("child: %v; its log:\n%s", err, out)
	}
	var warn string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "falling back") {
			warn = line
		}
	}
	for _, want := range []string{"balance_wanted=least_conn", "balance=kernel", "CAP_BPF", "protection="} {
		if !strings.Contains(warn, want) {
			t.Errorf("the fallback log line lacks %q: %q", want, warn)
		}
	}
	if !strings.Contains(out, "RESULT: fallback served") {
		t.Errorf("the child did not serve after the fallback:\n%s", out)
	}
	if after, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_migrate_req"); !bytes.Equal(before, after) {
		os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", before, 0)
		t.Errorf("an unprivileged child changed net.ipv4.tcp_migrate_req from %q to %q", before, after)
	}
	t.Logf("the child's fallback line: %s", warn)
}

// TestRollbackReattaches: a next generation that dies leaves its program
// on the socket group, its socket array holding the sockets; the old
// generation, rebuilt on its kept sockets (a rollback), still steers: it
// takes the dead one's program off and attaches its own.
func TestRollbackReattaches(t *testing.T) {
	requireSteering(t)
	build := func(files map[SocketKey]*os.File) *Manager {
		t.Helper()
		cfg := balanceConfig(config.BalanceLeastConn)
		cfg.SetDefaults()
		snap, err := BuildSnapshotN(cfg, Identity{}, 2)
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Options{Concurrency: 2, Inherited: files, Logger: testLogger()}, snap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	sockets := func(m *Manager) map[SocketKey]*os.File {
		t.Helper()
		f, err := m.Sockets()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	m1 := build(nil)
	child := build(sockets(m1))
	if child.listeners[0].steer == nil {
		t.Fatalf("the next generation does not steer: %v", child.listeners[0].steerErr)
	}
	child.Close() // dies; its program stays on the group
	m2 := build(sockets(m1))
	if m2.listeners[0].steer == nil {
		t.Fatalf("after the rollback the listener does not steer: %v", m2.listeners[0].steerErr)
	}
	m2.Start()
	a := addr(t, m2, "web")
	for range 4 {
		keepAlive(t, a)
	}
	w0, w1 := counter(m2, "worker.0."+statCxTotal), counter(m2, "worker.1."+statCxTotal)
	if w0 != 2 || w1 != 2 {
		t.Errorf("after the rollback, 4 long-lived connections spread %d, %d; want 2, 2", w0, w1)
	}
}
