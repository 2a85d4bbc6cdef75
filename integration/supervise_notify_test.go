package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestSuperviseNotifyReal checks the datagrams a fake NOTIFY_SOCKET gets
// from `hotproxy supervise` running real generations: READY=1 at start; on
// SIGHUP
// RELOADING=1 and MONOTONIC_USEC in one datagram, then READY=1; the same
// around a reload that fails on a config broken on disk, whose READY=1
// names the failure; STOPPING=1 on SIGTERM.
func TestSuperviseNotifyReal(t *testing.T) {
	requireServeContract(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	next := func(patterns ...string) string {
		t.Helper()
		buf := make([]byte, 4096)
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := nc.Read(buf)
		if err != nil {
			t.Fatalf("no datagram: %v", err)
		}
		d := string(buf[:n])
		lines := strings.Split(d, "\n")
		if len(lines) != len(patterns) {
			t.Fatalf("datagram %q: want %d lines like %q", d, len(patterns), patterns)
		}
		for i, p := range patterns {
			if !regexp.MustCompile("^" + p + "$").MatchString(lines[i]) {
				t.Fatalf("datagram %q: line %q does not match %q", d, lines[i], p)
			}
		}
		return d
	}
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	s := startSupervised(t, supervisedOpts{Config: c.TOML(), Env: []string{"NOTIFY_SOCKET=" + sock}})
	next(`READY=1`, `STATUS=epoch 0 serving \(pid \d+\)`)

	s.signal(syscall.SIGHUP)
	next(`RELOADING=1`, `MONOTONIC_USEC=\d+`, `STATUS=reloading: starting epoch 1`)
	next(`READY=1`, `STATUS=epoch 1 serving \(pid \d+\), epoch 0 draining \(pid \d+\)`)

	good, _ := os.ReadFile(s.cfgPath)
	os.WriteFile(s.cfgPath, []byte("[server]\nconcurrency = \"two\"\n"), 0o644)
	res := s.cli("reload")
	if res.Code == 0 {
		t.Fatalf("reload with a broken config exited 0: %s", res.Stdout)
	}
	next(`RELOADING=1`, `MONOTONIC_USEC=\d+`, `STATUS=reloading: starting epoch 2`)
	next(`READY=1`, fmt.Sprintf(`STATUS=reload to epoch 2 failed: epoch 2 \(pid \d+\): .*%s.*; epoch 1 serving \(pid \d+\).*`, regexp.QuoteMeta(s.cfgPath)))
	os.WriteFile(s.cfgPath, good, 0o644)

	if code := s.stop(30 * time.Second); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	next(`STOPPING=1`, `STATUS=stopping: signal terminated`)
}
