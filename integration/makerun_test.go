package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestMakeRunPortsOverridable runs `make run ARGS="-c FILE --base-id N"`
// as the README says, with a copy of config/default.toml whose two
// addresses are changed: the supervisor must serve on the new ports, and
// Ctrl-C (SIGINT to make's process group) must stop it.
func TestMakeRunPortsOverridable(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skipf("make not found (Debian: apt-get install make): %v", err)
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	def, err := os.ReadFile(filepath.Join(root, "config", "default.toml"))
	if err != nil {
		t.Fatal(err)
	}
	listen, admin := harness.FreeAddr(t), harness.FreeAddr(t)
	cfg := strings.NewReplacer(`"127.0.0.1:10000"`, strconv.Quote(listen), `"127.0.0.1:9901"`, strconv.Quote(admin)).Replace(string(def))
	if cfg == string(def) || !strings.Contains(cfg, listen) || !strings.Contains(cfg, admin) {
		t.Fatalf("config/default.toml no longer has the addresses 127.0.0.1:10000 and 127.0.0.1:9901:\n%s", def)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "my.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg+"\n[stats]\npath = "+strconv.Quote(filepath.Join(dir, "stats"))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := harness.UniqueBaseID()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-C", root, "run", "BIN="+filepath.Join(dir, "hotproxy"),
		fmt.Sprintf("ARGS=-c %s --base-id %d --control-socket %s", cfgPath, id, filepath.Join(dir, "ctl.sock")))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A file, not a pipe: the generations inherit it, and Wait would
	// wait for them to close a pipe.
	out, err := os.Create(filepath.Join(dir, "make-run.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once make is reaped, waitErr set before.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // Ctrl-C, to the group this test made
	}
	defer func() {
		select {
		case <-exited:
		default:
			stop()
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				select {
				case <-exited:
				case <-time.After(10 * time.Second):
					t.Errorf("make (pid %d) not reaped 10s after SIGKILL", cmd.Process.Pid)
				}
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("make run output:\n%s", b)
		}
	}()

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(4 * time.Minute) // make builds the binary first
	for {
		resp, err := client.Get("http://" + listen + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %s", listen, resp.Status)
			}
			break
		}
		select {
		case <-exited:
			t.Fatalf("make run exited before serving on %s: %v", listen, waitErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing served on %s within 4 minutes", listen)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, err := client.Get("http://" + admin + "/ready"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin on %s: %v %v", admin, resp, err)
	}
	stop()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("make run did not stop within 60s of Ctrl-C")
	}
}
