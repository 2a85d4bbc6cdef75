package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/integration/harness"
)

// Issue 20 item 1: abstract restart-socket names have no permissions, so
// any local user can bind a generation's name first and pose as its
// parent. These tests run such a squatter as uid 65534 (nobody): the test
// binary re-executed, binding the name and speaking the hand-over protocol
// for real (hotrestart.Listen), offering a listening socket of its own
// that it claims is the configured listener's, and a session-ticket key of
// its choosing. It reports every request it answers on stdout, so a test
// can see that nothing was asked of it.

// Environment of a squatter (see maybeSquat).
const (
	squatAddrEnv  = "HOTPROXY_TEST_SQUAT"       // the restart socket name to bind
	squatClaimEnv = "HOTPROXY_TEST_SQUAT_CLAIM" // the listener address it says its socket serves
	squatWaitEnv  = "HOTPROXY_TEST_SQUAT_WAIT"  // "1": wait (bounded) for the name to be free
)

func init() { maybeSquat() }

// maybeSquat is the squatter's main, when the environment asks for it.
func maybeSquat() {
	addr := os.Getenv(squatAddrEnv)
	if addr == "" {
		return
	}
	os.Exit(squat(addr, os.Getenv(squatClaimEnv), os.Getenv(squatWaitEnv) == "1"))
}

func squat(addr, claim string, wait bool) int {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if wait {
		// Bind the name the moment its holder dies: poll, bounded.
		free := false
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"}); err == nil {
				l.Close()
				free = true
				break
			}
		}
		if !free {
			fmt.Println("error: the name never came free")
			return 1
		}
	}
	p, err := hotrestart.Listen(hotrestart.ParentOptions{
		Address: addr,
		Self:    hotrestart.Identity{PID: os.Getpid(), BinaryVersion: "squatter"},
		Handler: squatHandler{ln: ln, claim: claim},
		Logger:  hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Info}),
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	go p.Serve()
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin) // until the test closes it
	p.Close()
	return 0
}

// squatHandler answers like a parent would, with the squatter's things.
type squatHandler struct {
	ln    *net.TCPListener
	claim string
}

var _ hotrestart.TicketKeySource = squatHandler{}

func (h squatHandler) Sockets() ([]hotrestart.Socket, []*os.File, error) {
	fmt.Println("gave sockets")
	f, err := h.ln.File()
	if err != nil {
		return nil, nil, err
	}
	return []hotrestart.Socket{{Network: "tcp", Address: h.claim, Worker: 0, Role: hotrestart.RoleListener, Name: "web"}}, []*os.File{f}, nil
}

func (h squatHandler) SessionTicketKeys() []hotrestart.ListenerTicketKeys {
	fmt.Println("gave ticket keys")
	key := make([]byte, hotrestart.TicketKeySize)
	for i := range key {
		key[i] = 0x5a
	}
	return []hotrestart.ListenerTicketKeys{{Listener: "web", Keys: []hotrestart.TicketKey{{Key: key, Created: time.Now().UnixNano()}}}}
}

func (squatHandler) Drain(hotrestart.Identity, []hotrestart.Socket) { fmt.Println("told to drain") }
func (squatHandler) ChildLost(hotrestart.Identity, bool, error)     {}

// squatter is a running squatter process.
type squatter struct {
	t         *testing.T
	addr      string
	pid       int
	mu        sync.Mutex // guards lines
	lines     []string   // its stdout
	listening chan struct{}
	stderr    strings.Builder
	stderrMu  sync.Mutex
}

// squatterBinary copies the test binary where nobody may run it (go test
// builds it in a directory only its owner may enter), once per test.
func squatterBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hotproxy-squatter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return installFile(t, self, filepath.Join(dir, "squatter.test"))
}

func installFile(t *testing.T, src, dst string) string {
	t.Helper()
	return harness.CopyExecutable(t, src, dst)
}

// startSquatter runs a squatter as nobody on the restart socket addr,
// claiming its socket serves claim. With wait, it binds addr once free;
// either way, waitListening says when it holds it.
func startSquatter(t *testing.T, addr, claim string, wait bool) *squatter {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to run a fake parent as uid 65534 (nobody); running as uid %d", os.Geteuid())
	}
	cmd := exec.Command(squatterBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), squatAddrEnv+"="+addr, squatClaimEnv+"="+claim)
	if wait {
		cmd.Env = append(cmd.Env, squatWaitEnv+"=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sq := &squatter{t: t, addr: addr, listening: make(chan struct{})}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		sq.stderrMu.Lock()
		defer sq.stderrMu.Unlock()
		return sq.stderr.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sq.pid = cmd.Process.Pid
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			sq.mu.Lock()
			sq.lines = append(sq.lines, sc.Text())
			sq.mu.Unlock()
			if sc.Text() == "listening" {
				close(sq.listening)
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { <-lines; cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("squatter on %s (pid %d): stdout %q\nstderr:\n%s", addr, sq.pid, sq.said(), sq.errors())
		}
	})
	if !wait {
		sq.waitListening(10 * time.Second)
	}
	return sq
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (sq *squatter) waitListening(timeout time.Duration) {
	sq.t.Helper()
	select {
	case <-sq.listening:
	case <-time.After(timeout):
		sq.t.Fatalf("squatter not listening on %s within %v: stdout %q\n%s", sq.addr, timeout, sq.said(), sq.errors())
	}
}

func (sq *squatter) said() []string {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	return append([]string(nil), sq.lines...)
}

func (sq *squatter) errors() string {
	sq.stderrMu.Lock()
	defer sq.stderrMu.Unlock()
	return sq.stderr.String()
}

// wantUntouched fails unless nothing was asked of the squatter: no
// sockets, no keys, no drain.
func (sq *squatter) wantUntouched() {
	sq.t.Helper()
	if said := sq.said(); len(said) != 1 || said[0] != "listening" {
		sq.t.Errorf("the squatter on %s was asked for something: %q (want only \"listening\")\n%s", sq.addr, said, sq.errors())
	}
	if strings.Contains(sq.errors(), "next generation connected") {
		sq.t.Errorf("a generation said hello to the squatter on %s:\n%s", sq.addr, sq.errors())
	}
}

// getOK GETs url n times, each on a new connection, and fails unless every
// one is answered 200 by the backend (not the proxy's own 5xx).
func getOK(t *testing.T, url string, n int) {
	t.Helper()
	c := newClient(10 * time.Second)
	for i := 0; i < n; i++ {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Close = true
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("request %d of %d to %s: %v", i+1, n, url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d of %d to %s: status %d", i+1, n, url, resp.StatusCode)
		}
	}
}

// TestSupervisedReloadsWhileTheNextRestartSocketIsSquatted (issue 20 item
// 1a): another user binds the next epoch's restart socket. Today every
// reload failed ("another generation is listening") and the supervisor
// retried the same epoch for ever. Now epoch 1 listens on an alternate
// name and says who squats the usual one, epoch 2 finds it there past
// the squatter, and the squatter is never spoken to.
func TestSupervisedReloadsWhileTheNextRestartSocketIsSquatted(t *testing.T) {
	requireServeContract(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	listener := c.Listeners[0].Address
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	sq := startSquatter(t, fmt.Sprintf("@hotproxy.%d.1", s.baseID), listener, false)

	var parentArg string // what epoch 2 must be told of epoch 1
	for epoch := 1; epoch <= 2; epoch++ {
		res := s.cli("reload")
		if res.Code != 0 || !strings.Contains(res.Stdout, fmt.Sprintf("epoch %d serves", epoch)) {
			t.Fatalf("reload %d with @hotproxy.%d.1 squatted: exit %d\n%s%s", epoch, s.baseID, res.Code, res.Stdout, res.Stderr)
		}
		getOK(t, "http://"+listener+"/", 10)
		if epoch == 1 {
			g, _ := s.mustStatus().Serving()
			started, err := hotrestart.ProcessStartTime(g.PID)
			if err != nil {
				t.Fatal(err)
			}
			parentArg = fmt.Sprintf("%d:%d", g.PID, started)
		}
	}
	g2, ok := s.mustStatus().Serving()
	if !ok || g2.Epoch != 2 {
		t.Fatalf("after two reloads: serving %+v (ok %v), want epoch 2", g2, ok)
	}
	// The supervisor named epoch 1 to epoch 2 by pid and start time.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", g2.PID))
	if err != nil {
		t.Fatal(err)
	}
	if want := "\x00--restart-parent\x00" + parentArg + "\x00"; !strings.Contains(string(cmdline), want) {
		t.Errorf("epoch 2's command line %q lacks %q", cmdline, want)
	}
	// Epoch 1 skipped the squatted name for an alternate, epoch 2 skipped
	// the squatter for that alternate; both said who squats.
	out := s.out.String()
	wantContains(t, "the supervisor's log", out,
		fmt.Sprintf("restart socket @hotproxy.%d.1 is held by another user (uid 65534, pid %d)", s.baseID, sq.pid),
		fmt.Sprintf("@hotproxy.%d.1.1", s.baseID),
		fmt.Sprintf("restart socket @hotproxy.%d.1: held by uid 65534 (pid %d), another user", s.baseID, sq.pid))
	sq.wantUntouched()
	if backend.Requests() < 20 {
		t.Errorf("the backend saw %d requests, want the 20 sent through the listener", backend.Requests())
	}
}

// TestSupervisorCrashRestartIgnoresASquatter (issue 20 item 1b): the
// serving generation is SIGKILLed and another user binds its restart
// socket the moment it is free. Today the supervisor's next epoch dialed
// the squatter and served on its socket with its ticket key. Now the
// supervisor never sends the new epoch to a restart socket after a crash:
// with hot_restart.keep_listeners (the default) it hands over the
// listening sockets it kept itself; without, it tells the new epoch that
// nothing serves, and it starts cold. Either way the squatter is never
// spoken to and the configured listener is the proxy's own.
func TestSupervisorCrashRestartIgnoresASquatter(t *testing.T) {
	requireServeContract(t)
	for _, tc := range []struct {
		keep bool
		want string
	}{
		{true, "took over the listening sockets the supervisor kept of the previous generation"},
		{false, "the supervisor says no generation serves: starting cold"},
	} {
		t.Run(fmt.Sprintf("keep_listeners=%v", tc.keep), func(t *testing.T) {
			backend := harness.StartHTTPBackend(t, "b1")
			c := supervisedProxyConfig(t, backend.Addr)
			c.Extra = fmt.Sprintf("[hot_restart]\ncommit_window = \"300ms\"\nkeep_listeners = %v\n", tc.keep)
			listener := c.Listeners[0].Address
			s := startSupervised(t, supervisedOpts{Config: c.TOML()})
			gen0, ok := s.mustStatus().Serving()
			if !ok {
				t.Fatal("nothing serves")
			}
			sq := startSquatter(t, fmt.Sprintf("@hotproxy.%d.0", s.baseID), listener, true)
			if err := syscall.Kill(gen0.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			sq.waitListening(10 * time.Second)

			var gen1 supervisorGeneration
			deadline := time.Now().Add(30 * time.Second)
			for {
				if g, ok := s.mustStatus().Serving(); ok && g.PID != gen0.PID {
					gen1 = supervisorGeneration{epoch: g.Epoch, pid: g.PID}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no new generation serves within 30s of the crash\n%s", s.out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			getOK(t, "http://"+listener+"/", 20)
			sq.wantUntouched()
			wantContains(t, "the supervisor's log", s.out.String(), tc.want)
			// The configured address is a socket of the proxy's own (bound
			// by the new generation, or kept from the old one), not one
			// the squatter handed over: the new generation's fds show a
			// listener bound to that port.
			if !ownsListener(t, gen1.pid, portOf(t, listener)) {
				t.Errorf("epoch %d (pid %d) does not listen on %s itself", gen1.epoch, gen1.pid, listener)
			}
		})
	}
}

type supervisorGeneration struct{ epoch, pid int }

// ownsListener reports whether process pid holds a TCP socket listening
// on port (from /proc/net/tcp's inodes and the process's fds).
func ownsListener(t *testing.T, pid, port int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		// sl local_address rem_address st ... inode (field 9); st 0A is LISTEN.
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil && int(p) == port {
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && inodes[target] {
			return true
		}
	}
	return false
}

// TestServeStartsPastASquattedEpoch0Socket (issue 20 item 1c): another
// user binds @hotproxy.<base-id>.0 first. Today `serve` exited advising
// `--restart-epoch 1`, and following the advice handed over to the
// squatter. Now epoch 0 starts on an alternate name and serves, saying who
// squats; a hand-started epoch 1 takes over from it, past the squatter.
func TestServeStartsPastASquattedEpoch0Socket(t *testing.T) {
	backend := harness.StartHTTPBackend(t, "b1")
	cfg := restartConfig("1s", "2s", "200ms", backend.Addr)
	tbl, _ := statsTable(t)
	cfg.Extra += "\n" + tbl
	cfg = cfg.Allocate(t)
	cfgPath := writeConfigFile(t, cfg.TOML())
	baseID := newBaseID()
	listener := cfg.Listeners[0].Address
	sq := startSquatter(t, fmt.Sprintf("@hotproxy.%d.0", baseID), listener, false)

	g0 := harness.StartGeneration(t, cfgPath, baseID, 0, harness.LaunchOptions{})
	if err := g0.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("epoch 0 with its restart socket squatted: %v\n%s", err, g0.Output())
	}
	wantContains(t, "epoch 0's log", g0.Stderr(),
		fmt.Sprintf("restart socket @hotproxy.%d.0 is held by another user (uid 65534, pid %d)", baseID, sq.pid),
		fmt.Sprintf("@hotproxy.%d.0.1", baseID))
	if strings.Contains(g0.Stderr(), "--restart-epoch 1") {
		t.Errorf("epoch 0 advises following the squatter with --restart-epoch 1:\n%s", g0.Stderr())
	}
	client := newClient(10 * time.Second)
	if _, body := get(t, client, "http://"+listener+"/pid"); body != strconv.Itoa(g0.PID()) {
		t.Fatalf("GET /pid: %q, want epoch 0's pid %d", body, g0.PID())
	}

	g1 := harness.StartGeneration(t, cfgPath, baseID, 1, harness.LaunchOptions{})
	if err := g1.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("epoch 1 past the squatter: %v\n%s", err, g1.Output())
	}
	wantContains(t, "epoch 1's log", g1.Stderr(),
		fmt.Sprintf("restart socket @hotproxy.%d.0: held by uid 65534 (pid %d), another user", baseID, sq.pid),
		fmt.Sprintf("from_pid=%d", g0.PID()))
	waitExit0(t, g0, exitTimeout)
	client.CloseIdleConnections()
	if _, body := get(t, client, "http://"+listener+"/pid"); body != strconv.Itoa(g1.PID()) {
		t.Fatalf("GET /pid after the hand-over: %q, want epoch 1's pid %d", body, g1.PID())
	}
	sq.wantUntouched()
}
