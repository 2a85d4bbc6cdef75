package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart/supervisor"
	"github.com/hotproxy/hotproxy/hotrestart/supervisor/supervisortest"
	"github.com/hotproxy/hotproxy/integration/harness"
)

// The test binary doubles as a fake generation (tableflip style) for the
// supervisor tests that need generations which misbehave on purpose.
func init() { supervisortest.MaybeRun() }

// supervisedOpts says how to start `hotproxy supervise`.
type supervisedOpts struct {
	// Config is the TOML config.
	Config string
	// Binary is the hotproxy binary to run (default: a copy of the one
	// under test, installed in a directory of the test, so that it can be
	// swapped).
	Binary string
	// GenerationBinary, if set, is passed as --generation-binary.
	GenerationBinary string
	// Env is added to the supervisor's environment.
	Env []string
	// Wrap prefixes the command line (e.g. unshare ...).
	Wrap []string
	// ControlSocket: default, a path in the test's directory.
	ControlSocket string
	// BaseID: default, a fresh one.
	BaseID int
	// Args are added to the supervise command line.
	Args []string
}

// supervised is one running `hotproxy supervise`.
type supervised struct {
	t       *testing.T
	bin     string
	dir     string
	cfgPath string
	ctl     string
	baseID  int
	cmd     *exec.Cmd
	out     outputFile
	done    chan struct{}

	// wrapped: the command runs the supervisor under a wrapper
	// (unshare --fork), whose only child is the supervisor.
	wrapped bool

	mu       sync.Mutex // guards lastGens
	lastGens []int
}

// supervisorPID is the supervisor's pid in this test's PID namespace.
func (s *supervised) supervisorPID() int {
	if !s.wrapped {
		return s.cmd.Process.Pid
	}
	kids := childrenOf(s.t, s.cmd.Process.Pid)
	if len(kids) != 1 {
		return 0
	}
	return kids[0]
}

// signal signals the supervisor (not its wrapper).
func (s *supervised) signal(sig syscall.Signal) {
	if pid := s.supervisorPID(); pid > 0 {
		syscall.Kill(pid, sig)
	}
}

// outputFile collects a process's output in a file: generations inherit
// it, and a pipe would keep exec.Cmd.Wait waiting for them.
type outputFile struct{ f *os.File }

func (o outputFile) String() string {
	b, _ := os.ReadFile(o.f.Name())
	return string(b)
}

// superviseBase hands out base-ids, apart from other tests' (which use
// 1<<29 and 1<<30 upwards) and from concurrent test binaries.
var superviseBase = 1<<28 + (os.Getpid()&0xfffff)<<6

// installBinary copies src to dir/bin/hotproxy, mode 0755, and returns
// the path: the "installed" binary a hot-swap replaces.
func installBinary(t *testing.T, src, dir string) string {
	t.Helper()
	dst := filepath.Join(dir, "bin", "hotproxy")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	return harness.CopyExecutable(t, src, dst)
}

// startSupervised starts `hotproxy supervise` and waits, through the
// control socket, until a generation serves.
func startSupervised(t *testing.T, o supervisedOpts) *supervised {
	t.Helper()
	dir := t.TempDir()
	superviseBase++
	if o.BaseID == 0 {
		o.BaseID = superviseBase
	}
	s := &supervised{t: t, dir: dir, cfgPath: filepath.Join(dir, "hotproxy.toml"), baseID: o.BaseID,
		done: make(chan struct{})}
	f, err := os.Create(filepath.Join(dir, "supervise.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.out = outputFile{f}
	s.ctl = o.ControlSocket
	if s.ctl == "" {
		s.ctl = filepath.Join(dir, "ctl.sock")
	}
	s.bin = o.Binary
	if s.bin == "" {
		s.bin = installBinary(t, harness.Binary(t), dir)
	}
	if err := os.WriteFile(s.cfgPath, []byte(o.Config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{}, o.Wrap...)
	args = append(args, s.bin, "supervise", "-c", s.cfgPath, "--base-id", fmt.Sprint(s.baseID), "--control-socket", s.ctl)
	if o.GenerationBinary != "" {
		args = append(args, "--generation-binary", o.GenerationBinary)
	}
	args = append(args, o.Args...)
	s.wrapped = len(o.Wrap) > 0
	s.cmd = exec.Command(args[0], args[1:]...)
	s.cmd.Env = append(os.Environ(), o.Env...)
	s.cmd.Stdout, s.cmd.Stderr = f, f
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(s.cleanup)
	s.waitServing(30 * time.Second)
	return s
}

func (s *supervised) cleanup() {
	select {
	case <-s.done:
	default:
		s.signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			s.t.Errorf("supervisor did not stop within 20s; killing it\n%s", s.out.String())
			// In a PID namespace, killing its init kills all of it.
			s.signal(syscall.SIGKILL)
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	// Generations the supervisor started, in case it could not stop them.
	s.mu.Lock()
	for _, pid := range s.lastGens {
		if err := syscall.Kill(pid, 0); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	s.mu.Unlock()
	os.Remove(fmt.Sprintf("/dev/shm/hotproxy.%d.stats", s.baseID))
	if s.t.Failed() {
		s.t.Logf("supervisor output:\n%s", s.out.String())
	}
}

// exited reports whether the supervisor process has exited.
func (s *supervised) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// status asks the control socket.
func (s *supervised) status() (*supervisor.Status, error) {
	resp, err := supervisor.Call(s.ctl, supervisor.OpStatus, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if !resp.OK || resp.Status == nil {
		return nil, fmt.Errorf("status: %s", resp.Error)
	}
	st := resp.Status
	if st.PID != 1 { // pids inside another pid namespace mean nothing here
		s.mu.Lock()
		s.lastGens = s.lastGens[:0]
		for _, g := range st.Generations {
			s.lastGens = append(s.lastGens, g.PID)
		}
		s.mu.Unlock()
	}
	return st, nil
}

func (s *supervised) mustStatus() *supervisor.Status {
	s.t.Helper()
	st, err := s.status()
	if err != nil {
		s.t.Fatalf("%v\n%s", err, s.out.String())
	}
	return st
}

// waitServing polls the control socket until a generation serves.
func (s *supervised) waitServing(timeout time.Duration) *supervisor.Status {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if s.exited() {
			s.t.Fatalf("supervisor exited (%v)\n%s", s.cmd.ProcessState, s.out.String())
		}
		st, err := s.status()
		if err == nil {
			if _, ok := st.Serving(); ok {
				return st
			}
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("no generation serves within %v (%v)\n%s", timeout, last, s.out.String())
	return nil
}

// waitGenerations polls until the supervisor lists n generations.
func (s *supervised) waitGenerations(n int, timeout time.Duration) *supervisor.Status {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var st *supervisor.Status
	for time.Now().Before(deadline) {
		st = s.mustStatus()
		if len(st.Generations) == n {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("%d generations after %v, want %d: %+v", len(st.Generations), timeout, n, st.Generations)
	return nil
}

// cli runs the installed binary with a control verb.
func (s *supervised) cli(args ...string) harness.RunResult {
	s.t.Helper()
	return runBinary(s.t, s.bin, append(args, "--control-socket", s.ctl)...)
}

// runBinary runs bin ARGS... to completion, bounded.
func runBinary(t *testing.T, bin string, args ...string) harness.RunResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	res := harness.RunResult{Stdout: stdout.String(), Stderr: stderr.String(), Code: -1}
	if cmd.ProcessState != nil {
		res.Code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %s: did not finish within 2m", bin, strings.Join(args, " "))
	}
	return res
}

// stop SIGTERMs the supervisor and returns its exit code.
func (s *supervised) stop(timeout time.Duration) int {
	s.t.Helper()
	s.signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		s.t.Fatalf("supervisor did not stop within %v\n%s", timeout, s.out.String())
	}
	return -1
}

// statusJSON is `hotproxy status --json` decoded.
func (s *supervised) statusJSON() supervisor.Status {
	s.t.Helper()
	res := s.cli("status", "--json")
	if res.Code != 0 {
		s.t.Fatalf("hotproxy status --json: exit %d: %s", res.Code, res.Stderr)
	}
	var st supervisor.Status
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
		s.t.Fatalf("hotproxy status --json: %v\n%s", err, res.Stdout)
	}
	return st
}

// requireRoot skips unless the test runs as root.
func requireRoot(t *testing.T, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root (namespaces); running as uid %d", what, os.Geteuid())
	}
}

// requireUnshare skips when unshare(1) is missing.
func requireUnshare(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("unshare(1) not found (util-linux): %v", err)
	}
	return p
}

// requireServeContract fails when the binary's serve lacks --ready-fd,
// which the supervisor relies on: a regression there must fail, not skip.
func requireServeContract(t *testing.T) {
	t.Helper()
	res := harness.Run(t, "serve", "--help")
	if !strings.Contains(res.Stdout+res.Stderr, "ready-fd") {
		t.Fatalf("hotproxy serve --help does not mention --ready-fd, which the supervisor needs:\n%s%s", res.Stdout, res.Stderr)
	}
}
