package supervisor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/hotrestart/supervisor"
	"github.com/hotproxy/hotproxy/hotrestart/supervisor/supervisortest"
)

// When the test binary is re-executed with controlDialEnv (as another
// user), it connects to that control socket controlTimesEnv times, one
// connection after the other, asks for the status, and reports how many
// answers refused it.
const (
	controlDialEnv  = "SUPERVISOR_TEST_CONTROL_DIAL"
	controlTimesEnv = "SUPERVISOR_TEST_CONTROL_TIMES"
)

func TestMain(m *testing.M) {
	supervisortest.MaybeRun()
	supervisor.MaybeRunFakeControl()
	if path := os.Getenv(controlDialEnv); path != "" {
		times, _ := strconv.Atoi(os.Getenv(controlTimesEnv))
		refused := 0
		for i := 0; i < times; i++ {
			// A raw client: supervisor.Call would refuse a socket in a
			// directory of root's before the supervisor could.
			resp, err := rawControlCall(path, supervisor.OpStatus)
			if err == nil && !resp.OK && strings.Contains(resp.Error, "may not control") {
				refused++
			}
		}
		fmt.Printf("refused %d of %d\n", refused, times)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rawControlCall sends one request the way any local program can, with
// none of supervisor.Call's checks.
func rawControlCall(path, op string) (*supervisor.Response, error) {
	c, err := net.DialTimeout("unix", path, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "{\"op\":%q}\n", op); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var resp supervisor.Response
	return &resp, json.Unmarshal(line, &resp)
}

// goodConfig is a valid hotproxy config with a short commit window, so
// that reloads follow each other quickly.
const goodConfig = `[server]
drain_time = "1s"
parent_shutdown_time = "2s"

[hot_restart]
commit_window = "300ms"
handoff_timeout = "3s"
`

// rig is one in-process supervisor running fake generations.
type rig struct {
	t       *testing.T
	dir     string
	cfg     string
	ctl     string
	baseID  int
	events  string
	notify  *net.UnixConn
	cancel  context.CancelFunc
	done    chan error
	sup     *supervisor.Supervisor
	envMore []string
	// logger, if set, is the supervisor's.
	logger hclog.Logger
}

var nextBase = os.Getpid() * 100

func newRig(t *testing.T, env ...string) *rig {
	t.Helper()
	dir := t.TempDir()
	nextBase++
	r := &rig{t: t, dir: dir, cfg: filepath.Join(dir, "hotproxy.toml"), ctl: filepath.Join(dir, "ctl.sock"),
		baseID: nextBase, events: filepath.Join(dir, "events"), envMore: env}
	if err := os.WriteFile(r.cfg, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

// withNotify binds a fake NOTIFY_SOCKET (abstract when abstract is set).
func (r *rig) withNotify(abstract bool) string {
	r.t.Helper()
	name := filepath.Join(r.dir, "notify.sock")
	if abstract {
		name = fmt.Sprintf("@hotproxy-test-notify.%d.%d", os.Getpid(), r.baseID)
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	r.notify = c
	return name
}

func (r *rig) start(notify string) {
	r.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		r.t.Fatal(err)
	}
	env := append([]string{supervisortest.EnvFake + "=1", supervisortest.EnvEvents + "=" + r.events}, r.envMore...)
	r.sup, err = supervisor.New(supervisor.Options{
		ConfigPath: r.cfg, BaseID: r.baseID, Binary: exe, Env: env,
		ControlSocket: r.ctl, NotifySocket: notify, StopMargin: 2 * time.Second, Logger: r.logger,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done = make(chan error, 1)
	go func() { r.done <- r.sup.Run(ctx) }()
	r.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
			r.t.Error("supervisor did not stop")
		}
	})
}

// stop cancels the supervisor and returns Run's error.
func (r *rig) stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(15 * time.Second):
		r.t.Fatal("supervisor did not stop within 15s")
	}
	return nil
}

// datagram reads the next notification.
func (r *rig) datagram() string {
	r.t.Helper()
	buf := make([]byte, 4096)
	r.notify.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := r.notify.Read(buf)
	if err != nil {
		r.t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

// wantDatagram reads the next notification and matches it line by line
// against patterns (anchored regexps).
func (r *rig) wantDatagram(patterns ...string) string {
	r.t.Helper()
	d := r.datagram()
	lines := strings.Split(d, "\n")
	if len(lines) != len(patterns) {
		r.t.Fatalf("notification %q: want %d lines matching %q", d, len(patterns), patterns)
	}
	for i, p := range patterns {
		if !regexp.MustCompile("^" + p + "$").MatchString(lines[i]) {
			r.t.Fatalf("notification %q: line %d %q does not match %q", d, i, lines[i], p)
		}
	}
	return d
}

func (r *rig) call(op string) *supervisor.Response {
	r.t.Helper()
	resp, err := supervisor.Call(r.ctl, op, 30*time.Second)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// waitServing waits (through status) until a generation serves.
func (r *rig) waitServing() *supervisor.Status {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := supervisor.Call(r.ctl, supervisor.OpStatus, 5*time.Second)
		if err == nil && resp.Status != nil {
			if _, ok := resp.Status.Serving(); ok {
				return resp.Status
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatal("no generation serves within 20s")
	return nil
}

func (r *rig) status() *supervisor.Status {
	r.t.Helper()
	resp := r.call(supervisor.OpStatus)
	if !resp.OK || resp.Status == nil {
		r.t.Fatalf("status: %+v", resp)
	}
	return resp.Status
}

// TestNotifySequence checks the exact datagrams systemd sees for a start,
// a good reload, a failed reload (config made invalid on disk) and a stop,
// over an abstract and a path NOTIFY_SOCKET.
func TestNotifySequence(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		t.Run(fmt.Sprintf("abstract=%v", abstract), func(t *testing.T) {
			r := newRig(t)
			r.start(r.withNotify(abstract))
			d := r.wantDatagram(`READY=1`, `STATUS=epoch 0 serving \(pid (\d+)\)`)
			pid0 := regexp.MustCompile(`pid (\d+)`).FindStringSubmatch(d)[1]

			resp := r.call(supervisor.OpReload)
			if !resp.OK || resp.Reload.Epoch != 1 {
				t.Fatalf("reload: %+v %+v", resp, resp.Reload)
			}
			r.wantDatagram(`RELOADING=1`, `MONOTONIC_USEC=\d+`, `STATUS=reloading: starting epoch 1`)
			r.wantDatagram(`READY=1`, fmt.Sprintf(`STATUS=epoch 1 serving \(pid %d\), epoch 0 draining \(pid %s\)`, resp.Reload.PID, pid0))

			if err := os.WriteFile(r.cfg, []byte("[server\nbroken"), 0o644); err != nil {
				t.Fatal(err)
			}
			bad := r.call(supervisor.OpReload)
			if bad.OK || bad.Reload == nil || bad.Reload.Epoch != 2 || bad.Reload.ServingEpoch != 1 {
				t.Fatalf("reload with a broken config: %+v %+v", bad, bad.Reload)
			}
			if !strings.Contains(bad.Error, "hotproxy.toml") {
				t.Errorf("failure does not name the config: %q", bad.Error)
			}
			r.wantDatagram(`RELOADING=1`, `MONOTONIC_USEC=\d+`, `STATUS=reloading: starting epoch 2`)
			r.wantDatagram(`READY=1`, fmt.Sprintf(`STATUS=reload to epoch 2 failed: epoch 2 \(pid \d+\): .*hotproxy.toml.*; epoch 1 serving \(pid %d\).*`, resp.Reload.PID))

			if err := r.stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
			r.wantDatagram(`STOPPING=1`, `STATUS=stopping: context cancelled`)
		})
	}
}

// TestReloadsCoalesce: reloads that arrive while one is in progress make
// exactly one more, and every caller gets an outcome.
func TestReloadsCoalesce(t *testing.T) {
	r := newRig(t, supervisortest.EnvReadyDelay+"=300ms")
	r.start("")
	r.waitServing()
	var wg sync.WaitGroup
	results := make(chan *supervisor.ReloadResult, 6)
	first := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp := r.call(supervisor.OpReload)
		results <- resp.Reload
	}()
	// Wait until the first reload is in progress (epoch 1 starting).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st := r.status()
		if len(st.Generations) == 2 {
			close(first)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-first:
	default:
		t.Fatal("first reload did not start")
	}
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- r.call(supervisor.OpReload).Reload
		}()
	}
	wg.Wait()
	close(results)
	epochs := map[int]int{}
	for res := range results {
		if !res.OK {
			t.Errorf("reload failed: %+v", res)
		}
		epochs[res.Epoch]++
	}
	if epochs[1] != 1 || epochs[2] != 5 || len(epochs) != 2 {
		t.Errorf("outcomes by epoch = %v, want 1 for epoch 1 and 5 for the coalesced epoch 2", epochs)
	}
	if st := r.status(); st.Reloads != 2 || st.ServingEpoch != 2 {
		t.Errorf("status: %d reloads, serving epoch %d; want 2 and 2", st.Reloads, st.ServingEpoch)
	}
}

// TestFailedEpochRetriedWithSameNumber: a failed epoch N+1 leaves N
// serving, and the next reload is N+1 again.
func TestFailedEpochRetriedWithSameNumber(t *testing.T) {
	r := newRig(t)
	r.start("")
	st := r.waitServing()
	g0, _ := st.Serving()
	os.WriteFile(r.cfg, []byte("nonsense = ["), 0o644)
	for i := 0; i < 2; i++ {
		resp := r.call(supervisor.OpReload)
		if resp.OK || resp.Reload.Epoch != 1 || resp.Reload.ServingPID != g0.PID {
			t.Fatalf("failed reload %d: %+v", i, resp.Reload)
		}
	}
	os.WriteFile(r.cfg, []byte(goodConfig), 0o644)
	resp := r.call(supervisor.OpReload)
	if !resp.OK || resp.Reload.Epoch != 1 {
		t.Fatalf("reload after fixing the config: %+v", resp.Reload)
	}
	st = r.status()
	if st.FailedReloads != 2 || st.Reloads != 1 || st.LastFailure == nil || st.LastFailure.Epoch != 1 {
		t.Errorf("status: %+v", st)
	}
}

// TestServingDiesRestartsCold: the serving generation killed outside a
// hand-over is replaced by a cold start.
func TestServingDiesRestartsCold(t *testing.T) {
	r := newRig(t)
	r.start("")
	st := r.waitServing()
	g0, _ := st.Serving()
	// The supervisor in this process started g0: it is ours to kill.
	syscall.Kill(g0.PID, syscall.SIGKILL)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st = r.status()
		if g, ok := st.Serving(); ok && g.PID != g0.PID {
			if g.Epoch != 1 {
				t.Errorf("cold restart has epoch %d, want 1", g.Epoch)
			}
			if st.LastFailure == nil || !strings.Contains(st.LastFailure.Reason, "died unexpectedly") {
				t.Errorf("last failure: %+v", st.LastFailure)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no new generation serves: %+v", st)
}

// TestRollbackWithinCommitWindow: a new generation that dies right after
// READY, within the commit window, leaves its parent serving, and the
// supervisor treats the parent as serving again.
func TestRollbackWithinCommitWindow(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "crashed")
	r := newRig(t, supervisortest.EnvCrashOnce+"="+marker)
	os.WriteFile(r.cfg, []byte(strings.Replace(goodConfig, `"300ms"`, `"3s"`, 1)), 0o644)
	r.start("")
	st := r.waitServing()
	g0, _ := st.Serving()
	r.call(supervisor.OpReload) // OK or not: it dies right after READY
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st = r.status()
		if g, ok := st.Serving(); ok && g.PID == g0.PID && len(st.Generations) == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g, ok := st.Serving(); !ok || g.PID != g0.PID || len(st.Generations) != 1 {
		t.Fatalf("epoch 0 does not serve alone again: %+v", st)
	}
	resp := r.call(supervisor.OpReload)
	if !resp.OK || resp.Reload.Epoch != 1 {
		t.Fatalf("reload after the rollback: %+v", resp.Reload)
	}
	ev, _ := os.ReadFile(r.events)
	if !strings.Contains(string(ev), fmt.Sprintf("resume 0 %d", g0.PID)) {
		t.Errorf("epoch 0 never resumed:\n%s", ev)
	}
}

// TestControlSocketGarbage: garbage gets an error answer, never a crash.
func TestControlSocketGarbage(t *testing.T) {
	r := newRig(t)
	r.start("")
	r.waitServing()
	for _, garbage := range []string{"garbage\n", `{"op":"launch"}` + "\n", strings.Repeat("x", 10000) + "\n", "\x00\xff\n"} {
		c, err := net.Dial("unix", r.ctl)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte(garbage))
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		c.Close()
		if !strings.Contains(string(buf[:n]), `"ok":false`) || !strings.Contains(string(buf[:n]), "bad request") {
			t.Errorf("garbage %.20q: answer %q", garbage, buf[:n])
		}
	}
	// A client that connects and goes away says nothing.
	c, _ := net.Dial("unix", r.ctl)
	c.Close()
	if st := r.status(); st.ServingEpoch != 0 {
		t.Errorf("after garbage: %+v", st)
	}
	fi, err := os.Stat(r.ctl)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket mode: %v %v", fi.Mode(), err)
	}
}

// lockedBuffer is a log destination written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestControlSocketFloodFromAnotherUser: a control socket that another
// user can reach (a careless --control-socket in a shared directory) and
// that user connecting 200 times: every connection is refused and counted
// in the status, and the log gets a line per interval, not one per
// connection.
func TestControlSocketFloodFromAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid (nobody)")
	}
	const flood = 200
	// Neither the build directory nor t.TempDir is open to nobody.
	shared, err := os.MkdirTemp("", "supervisor-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	var logged lockedBuffer
	r := newRig(t)
	r.logger = hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})
	r.start("")
	r.waitServing()
	// The supervisor refuses a shared directory for its socket: a second
	// name for the socket in one (a hard link, what a careless bind
	// mount would do too) is how nobody reaches it.
	reachable := filepath.Join(shared, "ctl.sock")
	if err := os.Link(r.ctl, reachable); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(reachable, 0o666); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(shared, "client.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), controlDialEnv+"="+reachable, fmt.Sprintf("%s=%d", controlTimesEnv, flood))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as nobody: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("refused %d of %d", flood, flood); !strings.Contains(string(out), want) {
		t.Fatalf("client as nobody says %q, want %q", out, want)
	}
	if st := r.status(); st.RefusedControlPeers != flood || st.ServingEpoch != 0 {
		t.Errorf("after the flood: refused_control_peers %d (want %d), serving epoch %d (want 0)", st.RefusedControlPeers, flood, st.ServingEpoch)
	}
	lines := strings.Count(logged.String(), "refused a control connection from another user")
	if lines < 1 || lines > 3 {
		t.Errorf("%d log lines for %d refused control connections, want 1 to 3:\n%s", lines, flood, logged.String())
	}
}

// TestBadConfigFailsFast: New refuses a config that does not load, naming
// the file, before anything is started.
func TestBadConfigFailsFast(t *testing.T) {
	r := newRig(t)
	os.WriteFile(r.cfg, []byte("[[["), 0o644)
	_, err := supervisor.New(supervisor.Options{ConfigPath: r.cfg, ControlSocket: "-"})
	if err == nil || !strings.Contains(err.Error(), r.cfg) {
		t.Fatalf("New with a broken config: %v", err)
	}
}

// TestSIGUSR1Forwarded: SIGUSR1 (reopen logs) and SIGUSR2 (re-read the
// TLS certificates) reach every generation. The test sends them to its
// own process, where the supervisor catches and forwards them (before
// SIGUSR2 was caught, it ended the test process).
func TestSIGUSR1Forwarded(t *testing.T) {
	r := newRig(t)
	r.start("")
	st := r.waitServing()
	g0, _ := st.Serving()
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
		want := fmt.Sprintf("usr%d 0 %d", map[syscall.Signal]int{syscall.SIGUSR1: 1, syscall.SIGUSR2: 2}[sig], g0.PID)
		deadline := time.Now().Add(10 * time.Second)
		for !eventSeen(r.events, want) && time.Now().Before(deadline) {
			syscall.Kill(os.Getpid(), sig)
			time.Sleep(50 * time.Millisecond)
		}
		if !eventSeen(r.events, want) {
			ev, _ := os.ReadFile(r.events)
			t.Fatalf("no %q in events:\n%s", want, ev)
		}
	}
}

func eventSeen(path, want string) bool {
	ev, _ := os.ReadFile(path)
	return strings.Contains(string(ev), want)
}

// TestEpoch0FailureIsTheSupervisors: when epoch 0 fails to start, Run
// returns the generation's reason.
func TestEpoch0FailureIsTheSupervisors(t *testing.T) {
	r := newRig(t, supervisortest.EnvFailEpochs+"=0")
	r.start("")
	select {
	case err := <-r.done:
		r.done <- err
		if err == nil || !strings.Contains(err.Error(), "epoch 0 did not start") || !strings.Contains(err.Error(), "told to fail") {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestHungGenerationTimesOut: a new generation that never becomes ready
// (and ignores SIGTERM) is killed after the ready timeout; the serving one
// is untouched and the next reload works.
func TestHungGenerationTimesOut(t *testing.T) {
	r := newRig(t, supervisortest.EnvHangEpochs+"=1")
	os.WriteFile(r.cfg, []byte(strings.Replace(goodConfig, `handoff_timeout = "3s"`, `handoff_timeout = "500ms"`, 1)), 0o644)
	exe, _ := os.Executable()
	sup, err := supervisor.New(supervisor.Options{
		ConfigPath: r.cfg, BaseID: r.baseID, Binary: exe, ControlSocket: r.ctl, ReadyMargin: 500 * time.Millisecond,
		Env: []string{supervisortest.EnvFake + "=1", supervisortest.EnvHangEpochs + "=1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	defer func() { cancel(); <-done }()
	st := r.waitServing()
	g0, _ := st.Serving()
	start := time.Now()
	resp := r.call(supervisor.OpReload)
	if resp.OK || !strings.Contains(resp.Error, "not ready within 1s") || resp.Reload.ServingPID != g0.PID {
		t.Fatalf("reload of a hung generation: %+v", resp.Reload)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timeout took %v", d)
	}
	// Epoch 1 hangs every time; the reload is retried as epoch 1 and
	// fails the same way, and the serving generation still serves.
	resp = r.call(supervisor.OpReload)
	if resp.OK || resp.Reload.Epoch != 1 {
		t.Fatalf("second reload: %+v", resp.Reload)
	}
	if st := r.status(); st.ServingEpoch != 0 || st.FailedReloads != 2 {
		t.Fatalf("status: %+v", st)
	}
}

// TestLdflagsVersion reads the version a build was linked with.
func TestLdflagsVersion(t *testing.T) {
	exe, _ := os.Executable()
	if v := supervisor.BinaryVersion(exe); v != "dev" {
		t.Errorf("BinaryVersion(test binary) = %q, want dev", v)
	}
	if v := supervisor.BinaryVersion("/etc/passwd"); v != "" {
		t.Errorf("BinaryVersion(not a binary) = %q", v)
	}
}

// FuzzControlRequest: no bytes on the control socket crash the decoder.
func FuzzControlRequest(f *testing.F) {
	for _, s := range []string{`{"op":"status"}`, `{"op":"reload"}`, `{"op":"reexec"}`, `{"op":1}`, `garbage`, ``, `{"op":"status","x":[1,2]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		supervisor.ParseRequestForTest(b)
	})
}

// TestCrashedGenerationReportsItsSignal (issue 15): a new generation that
// dies by a signal before it is ready is reported, to `reload` and in the
// log, with that signal, not as a pipe "closed without a word"; the log
// says the serving generation is untouched, because one serves.
func TestCrashedGenerationReportsItsSignal(t *testing.T) {
	var logged lockedBuffer
	r := newRig(t, supervisortest.EnvKillEpochs+"=1")
	r.logger = hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})
	r.start("")
	r.waitServing()
	resp := r.call(supervisor.OpReload)
	if resp.OK || resp.Reload == nil {
		t.Fatalf("reload to a generation that crashes: %+v, want a failure", resp)
	}
	if !strings.Contains(resp.Reload.Error, "SIGKILL") {
		t.Errorf("reload's reason %q does not name the signal SIGKILL", resp.Reload.Error)
	}
	if resp.Reload.ServingEpoch != 0 {
		t.Errorf("serving epoch after the failed reload: %d, want 0", resp.Reload.ServingEpoch)
	}
	if log := logged.String(); !strings.Contains(log, "the serving generation is untouched") {
		t.Errorf("log does not say the serving generation is untouched:\n%s", log)
	}
}

// TestFailedFirstGenerationIsNotCalledUntouched (issue 15): when epoch 0
// dies before it is ready, nothing was serving: the log must not claim
// that "the serving generation is untouched", and it names the signal.
func TestFailedFirstGenerationIsNotCalledUntouched(t *testing.T) {
	var logged lockedBuffer
	r := newRig(t, supervisortest.EnvKillEpochs+"=0")
	r.logger = hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})
	r.start("")
	select {
	case err := <-r.done:
		r.done <- err
		if err == nil || !strings.Contains(err.Error(), "SIGKILL") {
			t.Errorf("Run: %v, want an error that names SIGKILL", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	log := logged.String()
	if strings.Contains(log, "untouched") {
		t.Errorf("the log calls a serving generation untouched when none served:\n%s", log)
	}
	if !strings.Contains(log, "no generation serves") {
		t.Errorf("the log does not say that no generation serves:\n%s", log)
	}
}
