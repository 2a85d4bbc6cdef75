package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestProcessLogFileReopensOnSIGUSR1 (issue 15): with [log] path, the
// supervisor and its generation append their log to the file, not to
// stderr; after logrotate's rename and SIGUSR1 to the supervisor, both
// write their next lines to a new file at the path (the supervisor reopens
// its own and forwards the signal; the generation reopens in the handler
// that reopens access logs), and nothing more lands in the moved file.
func TestProcessLogFileReopensOnSIGUSR1(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "hotproxy.log")
	c := harness.Config{
		Listeners: []harness.Listener{{Name: "web", Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "ok"}}}},
		Extra:     "[log]\npath = \"" + logPath + "\"\n",
	}.Allocate(t)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})

	before, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("no process log at [log] path: %v", err)
	}
	for _, want := range []string{"supervisor: started generation", "hotproxy: "} {
		if !strings.Contains(string(before), want) {
			t.Errorf("log file lacks %q:\n%s", want, before)
		}
	}
	if out := s.out.String(); strings.Contains(out, "started generation") {
		t.Errorf("with [log] path set, the log still goes to stderr:\n%s", out)
	}

	rotated := logPath + ".1"
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	s.signal(syscall.SIGUSR1)
	// Both reopen lines are written right after each process reopened:
	// they are the first lines in the new file.
	wants := []string{"supervisor: SIGUSR1: process log reopened", "hotproxy: SIGUSR1: process log reopened: path=" + logPath}
	deadline := time.Now().Add(10 * time.Second)
	var after []byte
	for {
		after, _ = os.ReadFile(logPath)
		if strings.Contains(string(after), wants[0]) && strings.Contains(string(after), wants[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 10s of SIGUSR1, the new file at %s lacks %q:\n%s\nmoved file:\n%s", logPath, wants, after, mustRead(t, rotated))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A request makes no log line; a reload does, from both processes.
	if conn, err := net.Dial("tcp", c.Listeners[0].Address); err == nil {
		conn.Close()
	}
	if r := s.cli("reload"); r.Code != 0 {
		t.Fatalf("reload: %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if moved := mustRead(t, rotated); strings.Contains(moved, "SIGUSR1:") || strings.Contains(moved, "epoch=1") {
		t.Errorf("lines written after the reopen landed in the moved file:\n%s", moved)
	}
	if after := mustRead(t, logPath); !strings.Contains(after, "epoch=1") {
		t.Errorf("the new file lacks the reload's lines:\n%s", after)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
