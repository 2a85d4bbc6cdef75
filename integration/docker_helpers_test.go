package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart/supervisor"
	"github.com/hotproxy/hotproxy/integration/harness"
)

// The container tests (docker_*_test.go) run the image `make image` builds
// with a real engine: docker by default, or the CLI named by
// $HOTPROXY_ENGINE (podman), talking to whatever $DOCKER_HOST names. Every
// container uses --network host, --network none or --network
// container:NAME: all traffic stays on loopback or in a namespace of the
// test's own containers.

// envRequireEngine, set to 1 by .ci/run once it has an engine, turns the
// tests' "no engine" skip into a failure: where an engine was started
// for them, they must run.
const envRequireEngine = "HOTPROXY_REQUIRE_ENGINE"

// The image's user (scripts/image.sh): the uid a foreign container must
// not share.
const imageUID = 10001

type dockerEngine struct {
	cli string
}

var engineProbe struct {
	once sync.Once
	cli  string
	err  error
}

// requireEngine returns the container engine, or skips (fails, under
// HOTPROXY_REQUIRE_ENGINE=1) saying why there is none.
func requireEngine(t *testing.T) *dockerEngine {
	t.Helper()
	engineProbe.once.Do(func() {
		cli := os.Getenv("HOTPROXY_ENGINE")
		if cli == "" {
			cli = "docker"
		}
		path, err := exec.LookPath(cli)
		if err != nil {
			engineProbe.err = fmt.Errorf("no %s command: %w", cli, err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, "info", "--format", "{{.ServerVersion}}").CombinedOutput()
		if err != nil {
			engineProbe.err = fmt.Errorf("%s info: %v: %s", cli, err, bytes.TrimSpace(out))
			return
		}
		engineProbe.cli = path
	})
	if engineProbe.err != nil {
		msg := fmt.Sprintf("no container engine answers (%v): run .ci/run, or as root `eval \"$(scripts/engine.sh start DIR)\"` first", engineProbe.err)
		if os.Getenv(envRequireEngine) == "1" {
			t.Fatalf("%s=1, but %s", envRequireEngine, msg)
		}
		t.Skip(msg)
	}
	return &dockerEngine{cli: engineProbe.cli}
}

// engineResult is what one engine command printed and how it ended.
type engineResult struct {
	Stdout, Stderr string
	Code           int
}

func (r engineResult) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
}

// do runs the engine's CLI, bounded by timeout.
func (e *dockerEngine) do(timeout time.Duration, args ...string) engineResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cli, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := engineResult{Stdout: stdout.String(), Stderr: stderr.String()}
	if err != nil {
		res.Code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			res.Code = ee.ExitCode()
		}
		if ctx.Err() != nil {
			res.Stderr += fmt.Sprintf("\n(%s %s: no answer within %v)", e.cli, strings.Join(args, " "), timeout)
		}
	}
	return res
}

// must runs the engine's CLI and fails the test unless it exits 0.
func (e *dockerEngine) must(t *testing.T, args ...string) string {
	t.Helper()
	res := e.do(2*time.Minute, args...)
	if res.Code != 0 {
		t.Fatalf("%s %s: %v", e.cli, strings.Join(args, " "), res)
	}
	return strings.TrimSpace(res.Stdout)
}

// testImages are two tags of the image `make image` builds
// (scripts/image.sh), built once per test process: v1 and v2 of an
// upgrade.
var testImages struct {
	once   sync.Once
	v1, v2 string
	size   int64
	err    error
}

const testImageRepo = "hotproxy-test"

// images builds (once) and returns the two tags of the test image.
func (e *dockerEngine) images(t *testing.T) (v1, v2 string) {
	t.Helper()
	testImages.once.Do(func() {
		root, err := harness.ModuleRoot()
		if err != nil {
			testImages.err = err
			return
		}
		ctxDir, err := os.MkdirTemp("", "hotproxy-image-")
		if err != nil {
			testImages.err = err
			return
		}
		defer os.RemoveAll(ctxDir)
		v1, v2 := testImageRepo+":v1", testImageRepo+":v2"
		ctx, cancel := context.WithTimeout(context.Background(), harness.DefaultBuildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "image.sh"))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "IMAGE="+v1, "IMAGE_CONTEXT="+filepath.Join(ctxDir, "ctx"), "ENGINE="+e.cli, "VERSION=test-v1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			testImages.err = fmt.Errorf("scripts/image.sh: %v\n%s", err, out)
			return
		}
		if res := e.do(time.Minute, "tag", v1, v2); res.Code != 0 {
			testImages.err = fmt.Errorf("tag %s %s: %v", v1, v2, res)
			return
		}
		res := e.do(time.Minute, "image", "inspect", "-f", "{{.Size}}", v1)
		testImages.size, _ = strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
		testImages.v1, testImages.v2 = v1, v2
	})
	if testImages.err != nil {
		t.Fatalf("the test image: %v", testImages.err)
	}
	return testImages.v1, testImages.v2
}

// containerSeq numbers the containers of this test process.
var containerSeq int

// dockerContainer is one container a test started; it is removed by name
// at the end of the test (its log printed first if the test failed).
type dockerContainer struct {
	t    *testing.T
	e    *dockerEngine
	name string
}

// run starts a detached container named after the test process and role,
// with args between `run -d --name NAME` and the image (include the image
// and its arguments).
func (e *dockerEngine) run(t *testing.T, role string, args ...string) *dockerContainer {
	t.Helper()
	containerSeq++
	c := &dockerContainer{t: t, e: e, name: fmt.Sprintf("hpit-%d-%d-%s", os.Getpid(), containerSeq, role)}
	t.Cleanup(func() {
		if t.Failed() {
			res := e.do(30*time.Second, "logs", "--tail", "60", c.name)
			t.Logf("container %s, last log lines:\n%s%s", c.name, res.Stdout, res.Stderr)
		}
		e.do(time.Minute, "rm", "-f", "-v", c.name)
	})
	e.must(t, append([]string{"run", "-d", "--name", c.name}, args...)...)
	return c
}

// exec runs a command in the container (the image has no shell: argv is
// run as is).
func (c *dockerContainer) exec(args ...string) engineResult {
	return c.e.do(time.Minute, append([]string{"exec", c.name}, args...)...)
}

// inspect returns one field of `docker inspect` (a Go template).
func (c *dockerContainer) inspect(format string) string {
	return strings.TrimSpace(c.e.do(30*time.Second, "inspect", "-f", format, c.name).Stdout)
}

// running says whether the container still runs.
func (c *dockerContainer) running() bool { return c.inspect("{{.State.Running}}") == "true" }

// hostPID is the pid of the container's PID 1 as this test sees it.
func (c *dockerContainer) hostPID() int {
	c.t.Helper()
	pid, err := strconv.Atoi(c.inspect("{{.State.Pid}}"))
	if err != nil || pid <= 0 {
		c.t.Fatalf("container %s: no pid (%q, %v)", c.name, c.inspect("{{.State.Pid}}"), err)
	}
	return pid
}

// status asks the container's supervisor for its status (`hotproxy status
// --json` in the container).
func (c *dockerContainer) status(baseID int) (*supervisor.Status, error) {
	res := c.exec("/usr/local/bin/hotproxy", "status", "--json", "--base-id", strconv.Itoa(baseID))
	if res.Code != 0 {
		return nil, fmt.Errorf("hotproxy status in %s: %v", c.name, res)
	}
	var st supervisor.Status
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
		return nil, fmt.Errorf("hotproxy status in %s: %w: %s", c.name, err, res.Stdout)
	}
	return &st, nil
}

// waitServing polls the container's status until epoch serves (any
// epoch: -1) with no generation starting.
func (c *dockerContainer) waitServing(baseID, epoch int, timeout time.Duration) *supervisor.Status {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		st, err := c.status(baseID)
		if err == nil {
			starting := false
			for _, g := range st.Generations {
				starting = starting || g.State == supervisor.StateStarting
			}
			if g, ok := st.Serving(); ok && !starting && (epoch < 0 || g.Epoch == epoch) {
				return st
			}
			last = fmt.Errorf("status: %+v", st)
		} else {
			last = err
			if !c.running() {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("container %s: epoch %d not serving within %v: %v", c.name, epoch, timeout, last)
	return nil
}

// wait waits for the container to exit and returns its exit code.
func (c *dockerContainer) wait(timeout time.Duration) int {
	c.t.Helper()
	res := c.e.do(timeout, "wait", c.name)
	code, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if res.Code != 0 || err != nil {
		c.t.Fatalf("container %s did not exit within %v: %v", c.name, timeout, res)
	}
	return code
}

// waitHealth polls the engine's health status until it is want.
func (c *dockerContainer) waitHealth(want string, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var got string
	for time.Now().Before(deadline) {
		if got = c.inspect("{{.State.Health.Status}}"); got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("container %s: health %q after %v, want %q (last probe: %s)", c.name, got, timeout, want,
		c.inspect("{{with .State.Health}}{{range .Log}}{{.ExitCode}} {{.Output}}; {{end}}{{end}}"))
}

// writeContainerConfig writes a config file the image's user may read,
// for a bind mount over /etc/hotproxy/hotproxy.toml.
func writeContainerConfig(t *testing.T, toml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hotproxy.toml")
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path + ":/etc/hotproxy/hotproxy.toml:ro"
}

// nextBaseID hands out a base-id apart from every other test's: containers
// on the host network share its abstract restart sockets.
func nextBaseID() int {
	superviseBase++
	return superviseBase
}

// generationHostPID maps a generation's pid in its container (what
// `hotproxy status` says) to its pid here, among the children of the
// container's PID 1 (host pid sup), from the last field of NSpid.
func generationHostPID(t *testing.T, sup, pidInContainer int) int {
	t.Helper()
	for _, k := range childrenOf(t, sup) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", k))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(pidInContainer) {
				return k
			}
		}
	}
	t.Fatalf("no child of %d is pid %d in its container", sup, pidInContainer)
	return 0
}

// zombieChildren lists the children of pid that are zombies, and the
// others.
func zombieChildren(t *testing.T, pid int) (zombies, live []int) {
	t.Helper()
	for _, k := range childrenOf(t, pid) {
		if procState(k) == 'Z' {
			zombies = append(zombies, k)
		} else {
			live = append(live, k)
		}
	}
	return zombies, live
}

// inNetns runs curl in the network namespace of host pid (a container
// with --network none has only its own loopback).
func inNetns(t *testing.T, pid int, url string) string {
	t.Helper()
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatalf("nsenter (util-linux) is needed to reach a container's own loopback: %v", err)
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is needed to reach a container's own loopback: %v", err)
	}
	out, err := exec.Command(nsenter, "--net=/proc/"+strconv.Itoa(pid)+"/ns/net", curl, "-sS", "--max-time", "10", url).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s in the network namespace of pid %d: %v\n%s", url, pid, err, out)
	}
	return string(out)
}

// pauseSource is a pod's pause container: it holds its namespaces and
// does nothing until told to stop.
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`

var pauseImage struct {
	once sync.Once
	tag  string
	err  error
}

// pauseImage builds (once) an image FROM scratch holding a static pause
// program: a pod's pause container, with no registry to pull one from.
func (e *dockerEngine) pauseImage(t *testing.T) string {
	t.Helper()
	pauseImage.once.Do(func() {
		dir, err := os.MkdirTemp("", "hotproxy-pause-")
		if err != nil {
			pauseImage.err = err
			return
		}
		defer os.RemoveAll(dir)
		src := filepath.Join(dir, "pause.go")
		if err := os.WriteFile(src, []byte(pauseSource), 0o644); err != nil {
			pauseImage.err = err
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY pause /pause\nENTRYPOINT [\"/pause\"]\n"), 0o644); err != nil {
			pauseImage.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), harness.DefaultBuildTimeout)
		defer cancel()
		build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "pause"), src)
		build.Dir = dir
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := build.CombinedOutput(); err != nil {
			pauseImage.err = fmt.Errorf("go build pause.go: %v\n%s", err, out)
			return
		}
		tag := testImageRepo + ":pause"
		if res := e.do(2*time.Minute, "build", "-t", tag, dir); res.Code != 0 {
			pauseImage.err = fmt.Errorf("build %s: %v", tag, res)
			return
		}
		pauseImage.tag = tag
	})
	if pauseImage.err != nil {
		t.Fatalf("the pause image: %v", pauseImage.err)
	}
	return pauseImage.tag
}
