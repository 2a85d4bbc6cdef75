package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The harness's process handling is tested against a fake hotproxy: a
// shell script, so these tests need neither the real binary nor a build.
const fakeHotproxy = `#!/bin/sh
case "$1" in
serve)
	if grep -q SLEEP "$3"; then exec sleep 30; fi
	if grep -q INUSE "$3"; then
		echo 'listener "web": address "127.0.0.1:1": bind: address already in use' >&2
		exit 1
	fi
	if grep -q PYSERVE "$3"; then
		# Serve GET /ready (a file) on the admin port.
		port=$(sed -n 's/^address = "127.0.0.1:\([0-9]*\)"$/\1/p' "$3" | head -n 1)
		d=$(mktemp -d)
		echo LIVE > "$d/ready"
		exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$d"
	fi
	echo "boom: $3" >&2
	exit 3;;
version)
	echo "hotproxy fake"
	exit 0;;
esac
echo "unknown verb" >&2
exit 2
`

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fake-hotproxy-")
	if err != nil {
		panic(err)
	}
	bin := filepath.Join(dir, "hotproxy")
	if err := os.WriteFile(bin, []byte(fakeHotproxy), 0o755); err != nil {
		panic(err)
	}
	os.Setenv(EnvBinary, bin)
	code := Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestLaunchFailsFastWhenTheProcessExits(t *testing.T) {
	p := Launch(t, "[admin]\naddress = \""+ClosedAddr(t)+"\"\n")
	start := time.Now()
	err := p.WaitReady(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited with code 3") {
		t.Fatalf("WaitReady: want an early exit error, got %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("WaitReady noticed the exit after %v", el)
	}
	if !strings.Contains(p.Stderr(), "boom: "+p.ConfigPath) || !strings.Contains(p.Output(), "boom") {
		t.Errorf("stderr not captured: %q", p.Stderr())
	}
	if p.ExitCode() != 3 {
		t.Errorf("exit code %d, want 3", p.ExitCode())
	}
}

func TestWaitReadyTimesOutAndStopSignals(t *testing.T) {
	p := Launch(t, "# SLEEP\n[admin]\naddress = \""+ClosedAddr(t)+"\"\n")
	err := p.WaitReady(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not ready within") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("WaitReady: want a timeout naming the last error, got %v", err)
	}
	if p.Exited() {
		t.Fatal("process exited")
	}
	if err := p.WaitStderr("never", 50*time.Millisecond); err == nil {
		t.Error("WaitStderr: want a timeout")
	}
	if n, err := p.FDCount(); err != nil || n < 3 {
		t.Errorf("FDCount: %d, %v", n, err)
	}
	code, err := p.StopWithin(5 * time.Second)
	if err != nil || code != -1 { // sleep dies of the SIGTERM
		t.Errorf("StopWithin: code %d, err %v", code, err)
	}
}

func TestRun(t *testing.T) {
	r := Run(t, "version")
	if r.Code != 0 || r.Stdout != "hotproxy fake\n" {
		t.Errorf("version: %+v", r)
	}
	r = Run(t, "nope")
	if r.Code != 2 || !strings.Contains(r.Stderr, "unknown verb") {
		t.Errorf("nope: %+v", r)
	}
}

func TestStartProxyFuncRetriesAPortRace(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 (the fake's /ready server) is not installed")
	}
	calls := 0
	p := StartProxyFunc(t, func() string {
		calls++
		marker := "PYSERVE"
		if calls == 1 {
			marker = "INUSE"
		}
		return "# " + marker + "\n[admin]\naddress = \"" + FreeAddr(t) + "\"\n"
	})
	if calls != 2 {
		t.Errorf("config generated %d times, want 2", calls)
	}
	if code, body := p.AdminGet("/ready"); code != 200 || string(body) != "LIVE\n" {
		t.Errorf("/ready: %d %q", code, body)
	}
	p.Stop()
	if !p.Exited() {
		t.Error("still running after Stop")
	}
}
