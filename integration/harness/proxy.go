package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/hotproxy/hotproxy/shm"
)

// Defaults for the proxy's lifecycle, exported so tests can name them.
const (
	// DefaultReadyTimeout bounds the wait for GET /ready to answer 200.
	DefaultReadyTimeout = 15 * time.Second
	// ReadyPollInterval is how often /ready is polled.
	ReadyPollInterval = 15 * time.Millisecond
	// DefaultStopTimeout bounds Stop (SIGTERM until exit). Tests that
	// configure a drain_time longer than this must use StopWithin.
	DefaultStopTimeout = 20 * time.Second
	// DefaultRunTimeout bounds Run (a verb expected to exit by itself).
	DefaultRunTimeout = 20 * time.Second
	// killWait bounds the wait for a killed process to be reaped.
	killWait = 10 * time.Second
)

// Proxy is one hotproxy process started by the harness.
type Proxy struct {
	tb testing.TB

	// ConfigPath is the config file the process was started with.
	ConfigPath string
	// AdminAddr is the [admin] address read from the config ("" if the
	// config has none or does not parse).
	AdminAddr string
	// Listeners maps listener names to their configured addresses.
	Listeners map[string]string

	cmd    *exec.Cmd
	wrap   []string // a command that execs hotproxy in its place (see LaunchWithOpenFileLimit)
	stdout syncBuffer
	stderr syncBuffer
	admin  *http.Client

	done     chan struct{} // closed when the process has been reaped
	waitErr  error         // set before done is closed
	exitCode int           // set before done is closed; -1 if killed by a signal
}

// Launch writes cfg to a temporary file and starts `hotproxy serve -c FILE
// ARGS...` without waiting for it to become ready. The process is killed (by
// its pid) when the test ends if it is still running; its output is logged
// if the test failed. Unless args hold --base-id, it gets a base-id of its
// own (see UniqueBaseID), so that tests running at once never meet on a
// restart socket.
func Launch(tb testing.TB, cfg string, args ...string) *Proxy {
	tb.Helper()
	path := WriteConfig(tb, cfg)
	args, _ = withBaseID(args)
	p := newProxy(tb, path)
	p.parseConfig(cfg)
	p.start(append([]string{"serve", "-c", path}, args...))
	return p
}

// lastBaseID is the last base-id UniqueBaseID handed out.
var lastBaseID atomic.Int64

func init() { lastBaseID.Store(1<<30 + int64(os.Getpid())<<8) }

// UniqueBaseID returns a base-id no other test of this process (nor,
// likely, of another test binary running at once) uses: far from the
// small numbers people use, apart per process id.
func UniqueBaseID() int { return int(lastBaseID.Add(1)) }

// withBaseID prepends "--base-id N" with a unique N to args unless they
// set one; it returns the args and N, or -1 when args had their own.
func withBaseID(args []string) ([]string, int) {
	for _, a := range args {
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "base-id" {
			return args, -1
		}
	}
	id := UniqueBaseID()
	return append([]string{"--base-id", strconv.Itoa(id)}, args...), id
}

// Default addresses of the embedded default config (`serve` with no -c).
const (
	DefaultConfigAdmin    = "127.0.0.1:9901"
	DefaultConfigListener = "127.0.0.1:10000"
)

// LaunchDefault starts `hotproxy serve ARGS...` without -c: the embedded
// default config, whose ports are fixed (DefaultConfigAdmin and
// DefaultConfigListener, listener name "default").
//
// Unless args hold --base-id, it gets a base-id of its own (like Launch)
// whose stats region (/dev/shm/hotproxy.<id>.stats: the embedded config
// sets no [stats] path) is removed when the test ends.
func LaunchDefault(tb testing.TB, args ...string) *Proxy {
	tb.Helper()
	args, id := withBaseID(args)
	if id >= 0 {
		// Runs after the process is reaped (cleanups run last first).
		tb.Cleanup(func() { os.Remove(shm.DefaultPath(uint64(id))) })
	}
	p := newProxy(tb, "")
	p.AdminAddr = DefaultConfigAdmin
	p.Listeners["default"] = DefaultConfigListener
	p.start(append([]string{"serve"}, args...))
	return p
}

func newProxy(tb testing.TB, path string) *Proxy {
	return &Proxy{
		tb:         tb,
		ConfigPath: path,
		Listeners:  map[string]string{},
		done:       make(chan struct{}),
		admin: &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
		},
	}
}

func (p *Proxy) start(args []string) {
	p.tb.Helper()
	bin := Binary(p.tb)
	argv := append(append(append([]string(nil), p.wrap...), bin), args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("start %s: %v", bin, err)
	}
	go p.reap()
	p.tb.Cleanup(p.cleanup)
}

// StartProxy launches hotproxy with cfg and waits until it is ready. It
// fails the test, showing the process's output, if the process exits first
// or is not ready within DefaultReadyTimeout.
func StartProxy(tb testing.TB, cfg string, args ...string) *Proxy {
	tb.Helper()
	p := Launch(tb, cfg, args...)
	if err := p.WaitReady(DefaultReadyTimeout); err != nil {
		tb.Fatalf("hotproxy not ready: %v\n%s", err, p.Output())
	}
	return p
}

// StartProxyFunc is StartProxy with a config generator: if the first process
// exits because a port it was given is already in use (the race between
// FreePort and the bind), gen is called again for fresh ports and the start
// is retried once.
func StartProxyFunc(tb testing.TB, gen func() string, args ...string) *Proxy {
	tb.Helper()
	p := Launch(tb, gen(), args...)
	err := p.WaitReady(DefaultReadyTimeout)
	if err != nil && p.Exited() && strings.Contains(strings.ToLower(p.Stderr()), "address already in use") {
		tb.Logf("hotproxy lost a port race, retrying with fresh ports: %v\n%s", err, p.Output())
		p = Launch(tb, gen(), args...)
		err = p.WaitReady(DefaultReadyTimeout)
	}
	if err != nil {
		tb.Fatalf("hotproxy not ready: %v\n%s", err, p.Output())
	}
	return p
}

// WriteConfig writes cfg to a file in the test's temporary directory and
// returns its path. Unless cfg has a [stats] table, one is appended whose
// path is the test's own stats region (StatsPath), so that tests never
// share a region and never touch the default /dev/shm one.
func WriteConfig(tb testing.TB, cfg string) string {
	tb.Helper()
	if !hasStatsTable.MatchString(cfg) {
		cfg += fmt.Sprintf("\n[stats]\npath = %q\n", StatsPath(tb))
	}
	f, err := os.CreateTemp(tb.TempDir(), "hotproxy-*.toml")
	if err != nil {
		tb.Fatalf("write config: %v", err)
	}
	if _, err := f.WriteString(cfg); err != nil {
		tb.Fatalf("write config: %v", err)
	}
	if err := f.Close(); err != nil {
		tb.Fatalf("write config: %v", err)
	}
	return filepath.Clean(f.Name())
}

var hasStatsTable = regexp.MustCompile(`(?m)^\s*\[\s*stats\s*\]`)

var statsPaths sync.Map // testing.TB -> string

// StatsPath returns the stats region file of tb: one per test (and
// subtest), in its temporary directory, shared by every config the test
// writes with WriteConfig, so the generations of one test count into one
// region.
func StatsPath(tb testing.TB) string {
	tb.Helper()
	if p, ok := statsPaths.Load(tb); ok {
		return p.(string)
	}
	p, loaded := statsPaths.LoadOrStore(tb, filepath.Join(tb.TempDir(), "hotproxy.stats"))
	if !loaded {
		tb.Cleanup(func() { statsPaths.Delete(tb) })
	}
	return p.(string)
}

func (p *Proxy) parseConfig(cfg string) {
	var c struct {
		Admin struct {
			Address string `toml:"address"`
		} `toml:"admin"`
		Listeners []struct {
			Name    string `toml:"name"`
			Address string `toml:"address"`
		} `toml:"listeners"`
	}
	if _, err := toml.Decode(cfg, &c); err != nil {
		return // a bad config under test; the process will say why
	}
	p.AdminAddr = c.Admin.Address
	for _, l := range c.Listeners {
		p.Listeners[l.Name] = l.Address
	}
}

func (p *Proxy) reap() {
	err := p.cmd.Wait()
	p.waitErr = err
	p.exitCode = p.cmd.ProcessState.ExitCode()
	close(p.done)
}

func (p *Proxy) cleanup() {
	if !p.Exited() {
		// Only the process this harness started, by its pid.
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(killWait):
			p.tb.Errorf("hotproxy pid %d: not reaped %v after SIGKILL", p.PID(), killWait)
		}
	}
	if p.tb.Failed() {
		p.tb.Logf("hotproxy pid %d (config %s) output:\n%s", p.PID(), p.ConfigPath, p.Output())
	}
}

// PID returns the process id.
func (p *Proxy) PID() int { return p.cmd.Process.Pid }

// Addr returns the configured address of the listener named name, failing
// the test if there is none.
func (p *Proxy) Addr(name string) string {
	p.tb.Helper()
	a, ok := p.Listeners[name]
	if !ok {
		p.tb.Fatalf("no listener %q in the config", name)
	}
	return a
}

// URL returns "http://ADDR" for the listener named name, followed by path.
func (p *Proxy) URL(name, path string) string {
	p.tb.Helper()
	return "http://" + p.Addr(name) + path
}

// Stdout returns what the process wrote to stdout so far.
func (p *Proxy) Stdout() string { return p.stdout.String() }

// Stderr returns what the process wrote to stderr so far (its logs).
func (p *Proxy) Stderr() string { return p.stderr.String() }

// Output returns stdout and stderr, labelled, for failure messages.
func (p *Proxy) Output() string {
	return fmt.Sprintf("--- stdout (pid %d) ---\n%s--- stderr ---\n%s--- end ---", p.PID(), p.Stdout(), p.Stderr())
}

// Exited reports whether the process has exited (and been reaped).
func (p *Proxy) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done returns a channel closed when the process has exited.
func (p *Proxy) Done() <-chan struct{} { return p.done }

// ExitCode returns the exit code of an exited process (-1 if a signal
// killed it), or fails the test if it is still running.
func (p *Proxy) ExitCode() int {
	p.tb.Helper()
	if !p.Exited() {
		p.tb.Fatalf("hotproxy pid %d still running", p.PID())
	}
	return p.exitCode
}

// Signal sends sig to the process.
func (p *Proxy) Signal(sig os.Signal) {
	p.tb.Helper()
	if p.Exited() {
		p.tb.Fatalf("signal %v: hotproxy pid %d already exited (code %d)", sig, p.PID(), p.exitCode)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.tb.Fatalf("signal %v to pid %d: %v", sig, p.PID(), err)
	}
}

// Wait waits up to timeout for the process to exit by itself and returns its
// exit code. On timeout it returns an error and leaves the process running.
func (p *Proxy) Wait(timeout time.Duration) (int, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.exitCode, nil
	case <-t.C:
		return 0, fmt.Errorf("hotproxy pid %d did not exit within %v", p.PID(), timeout)
	}
}

// StopWithin sends SIGTERM and waits up to timeout for the exit code. On
// timeout the process is killed and an error returned.
func (p *Proxy) StopWithin(timeout time.Duration) (int, error) {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	code, err := p.Wait(timeout)
	if err != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
		return -1, err
	}
	return code, nil
}

// Stop sends SIGTERM and returns the exit code, failing the test if the
// process does not exit within DefaultStopTimeout.
func (p *Proxy) Stop() int {
	p.tb.Helper()
	code, err := p.StopWithin(DefaultStopTimeout)
	if err != nil {
		p.tb.Errorf("stop: %v", err)
	}
	return code
}

// WaitReady polls GET /ready on the admin address until it answers 200. It
// returns an error if the process exits first or the timeout passes.
func (p *Proxy) WaitReady(timeout time.Duration) error {
	if p.AdminAddr == "" {
		return errors.New("config has no [admin] address to poll")
	}
	deadline := time.Now().Add(timeout)
	client := &http.Client{
		Timeout:   500 * time.Millisecond,
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
	}
	tick := time.NewTicker(ReadyPollInterval)
	defer tick.Stop()
	var last string
	for {
		resp, err := client.Get("http://" + p.AdminAddr + "/ready")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("hotproxy pid %d exited with code %d before it was ready", p.PID(), p.exitCode)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hotproxy pid %d not ready within %v (last /ready: %s)", p.PID(), timeout, last)
		}
	}
}

// AdminDo sends one request to the admin API and returns the response (body
// already read and closed) and its body.
func (p *Proxy) AdminDo(method, path string) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+p.AdminAddr+path, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := p.admin.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// AdminGet GETs path on the admin API and returns the status and body,
// failing the test on a transport error.
func (p *Proxy) AdminGet(path string) (int, []byte) {
	p.tb.Helper()
	resp, body, err := p.AdminDo(http.MethodGet, path)
	if err != nil {
		p.tb.Fatalf("admin GET %s: %v", path, err)
	}
	return resp.StatusCode, body
}

// AdminPost POSTs to path on the admin API and returns the status and body,
// failing the test on a transport error.
func (p *Proxy) AdminPost(path string) (int, []byte) {
	p.tb.Helper()
	resp, body, err := p.AdminDo(http.MethodPost, path)
	if err != nil {
		p.tb.Fatalf("admin POST %s: %v", path, err)
	}
	return resp.StatusCode, body
}

// ServerInfo is the decoded JSON of GET /server_info. The field types are
// the product's; use the accessors to read them without guessing.
type ServerInfo map[string]any

// String returns key as a string ("" if absent; numbers are formatted).
func (s ServerInfo) String(key string) string {
	switch v := s[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// Int returns key as an int and whether it was a number.
func (s ServerInfo) Int(key string) (int, bool) {
	v, ok := s[key].(float64)
	return int(v), ok
}

// ServerInfo GETs /server_info and decodes it, failing the test if it is
// not a 200 with a JSON object.
func (p *Proxy) ServerInfo() ServerInfo {
	p.tb.Helper()
	code, body := p.AdminGet("/server_info")
	if code != http.StatusOK {
		p.tb.Fatalf("GET /server_info: status %d: %s", code, body)
	}
	var info ServerInfo
	if err := json.Unmarshal(body, &info); err != nil {
		p.tb.Fatalf("GET /server_info: %v: %s", err, body)
	}
	return info
}

// RunResult is the outcome of a hotproxy invocation that exits by itself.
type RunResult struct {
	Stdout, Stderr string
	// Code is the exit code; -1 if a signal (or the harness, on timeout)
	// killed the process.
	Code int
}

// Run runs `hotproxy ARGS...` to completion (at most DefaultRunTimeout,
// after which it is killed and the test fails) and returns its output and
// exit code.
func Run(tb testing.TB, args ...string) RunResult {
	tb.Helper()
	bin := Binary(tb)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = sysProcAttr()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := RunResult{Stdout: stdout.String(), Stderr: stderr.String()}
	if cmd.ProcessState != nil {
		res.Code = cmd.ProcessState.ExitCode()
	} else {
		res.Code = -1
	}
	if ctx.Err() != nil {
		tb.Errorf("hotproxy %s: did not exit within %v\nstdout:\n%s\nstderr:\n%s",
			strings.Join(args, " "), DefaultRunTimeout, res.Stdout, res.Stderr)
		return res
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		tb.Fatalf("hotproxy %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WaitStderr polls the process's stderr until it contains substr, the
// process exits, or timeout passes.
func (p *Proxy) WaitStderr(substr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Stderr(), substr) {
		if p.Exited() {
			return fmt.Errorf("hotproxy pid %d exited (code %d) before logging %q", p.PID(), p.exitCode, substr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hotproxy pid %d did not log %q within %v", p.PID(), substr, timeout)
		}
		time.Sleep(ReadyPollInterval)
	}
	return nil
}

// FDCount returns the number of open file descriptors of the running
// process (from /proc), for leak checks.
func (p *Proxy) FDCount() (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.PID()))
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}
