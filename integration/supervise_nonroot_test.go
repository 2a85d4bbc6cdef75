package integration

import (
	"bytes"
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
)

// TestSuperviseAsUnprivilegedUser (issue 15): `supervise`, `status`,
// `reload` and `stats` work for a user who is not root and has no
// $XDG_RUNTIME_DIR. The supervisor cannot create /run/hotproxy, so it puts
// its control socket in a private 0700 directory under the temp dir named
// for the uid, and the CLI finds it there without --control-socket. Before
// the fallback, supervise failed with "bind: permission denied".
func TestSuperviseAsUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the processes as uid 65534 (nobody)")
	}
	const nobody = 65534
	// The test's temporary directory is not readable by nobody: copy the
	// binary and the config to a directory that is, and give nobody a
	// world-writable temp dir of its own (TMPDIR) to create its private
	// directory in.
	dir, err := os.MkdirTemp("", "hotproxy-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o755}, {tmp, os.ModeSticky | 0o777}} {
		if err := os.Chmod(m.path, m.mode); err != nil {
			t.Fatal(err)
		}
	}
	c := harness.Config{Listeners: []harness.Listener{{
		Name: "web", Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "hello"}},
	}}}.Allocate(t)
	bin, cfgPath := filepath.Join(dir, "hotproxy"), filepath.Join(dir, "hotproxy.toml")
	src, err := os.ReadFile(harness.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(c.TOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	superviseBase++
	baseID := fmt.Sprint(superviseBase)
	t.Cleanup(func() { os.Remove("/dev/shm/hotproxy." + baseID + ".stats") })

	env := []string{"PATH=/usr/bin:/bin", "HOME=" + tmp, "TMPDIR=" + tmp}
	asNobody := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: nobody, Gid: nobody},
			Pdeathsig:  syscall.SIGKILL,
		}
		return cmd
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := asNobody(args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}

	sup := asNobody("supervise", "-c", cfgPath, "--base-id", baseID)
	logFile, err := os.Create(filepath.Join(dir, "supervise.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	sup.Stdout, sup.Stderr = logFile, logFile
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { sup.Wait(); close(done) }()
	t.Cleanup(func() {
		sup.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("supervisor did not stop within 20s")
			sup.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("supervisor output:\n%s", b)
		}
	})

	// Ready when `status` answers with a serving generation: bounded.
	var status string
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := run("status", "--base-id", baseID)
		if err == nil && strings.Contains(out, "serving") {
			status = out
			break
		}
		select {
		case <-done:
			t.Fatalf("supervise as uid %d exited early; last status: %v\n%s", nobody, err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no serving generation within 30s; last status: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("status:\n%s", status)

	sock := filepath.Join(tmp, fmt.Sprintf("hotproxy-%d", nobody), "hotproxy."+baseID+".sock")
	fi, err := os.Lstat(filepath.Dir(sock))
	if err != nil {
		t.Fatalf("the private runtime directory: %v", err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || st.Uid != nobody {
		t.Errorf("%s: mode %v uid %d, want 0700 owned by %d", filepath.Dir(sock), fi.Mode().Perm(), st.Uid, nobody)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("no control socket at %s: %v", sock, err)
	}

	get := func() string {
		t.Helper()
		resp, err := http.Get("http://" + c.Listeners[0].Address + "/")
		if err != nil {
			t.Fatalf("GET through the proxy run by uid %d: %v", nobody, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if body := get(); body != "hello" {
		t.Errorf("body %q, want hello", body)
	}

	out, err := run("reload", "--base-id", baseID)
	if err != nil {
		t.Fatalf("reload as uid %d: %v\n%s", nobody, err, out)
	}
	out, err = run("status", "--base-id", baseID, "--json")
	if err != nil || !strings.Contains(out, `"serving_epoch": 1`) {
		t.Errorf("status after reload: %v, want serving_epoch 1\n%s", err, out)
	}
	if body := get(); body != "hello" {
		t.Errorf("body after reload %q, want hello", body)
	}

	out, err = run("stats", "--base-id", baseID, "--filter", `^listener\.web\.downstream_rq_total$`)
	if err != nil || !strings.Contains(out, "listener.web.downstream_rq_total") {
		t.Errorf("stats as uid %d: %v\n%s", nobody, err, out)
	}

	// server.timer_slack without CAP_SYS_NICE: a generation cannot set
	// its other threads' slack, but the supervisor starts it with the
	// slack on its first thread, so that every thread inherits it.
	kids := childrenOf(t, sup.Process.Pid)
	if len(kids) == 0 {
		t.Fatal("the supervisor has no generation to look at")
	}
	for _, kid := range kids {
		checkTimerSlack(t, kid, time.Millisecond)
	}
	if b, _ := os.ReadFile(logFile.Name()); bytes.Contains(b, []byte("timer_slack is not on every thread")) {
		t.Errorf("a generation of the unprivileged supervisor could not set its timer slack:\n%s", b)
	}
}
