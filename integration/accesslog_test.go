package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// accessLogLines reads path's JSON lines, failing on any line that is not
// one whole JSON object (a split or interleaved write).
func accessLogLines(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d is not a whole JSON line: %q: %v", i+1, line, err)
		}
		out = append(out, m)
	}
	return out
}

// waitLines waits (bounded) until path has want lines, and returns them.
func waitLines(t testing.TB, path string, want int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lines := accessLogLines(t, path)
		if len(lines) >= want || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(pollEvery)
	}
}

// TestAccessLogAcrossHotRestartUnderLoad: under load in both connection
// modes, through hot restarts whose generations append to one file,
// every request the backend answered has exactly one whole line, and
// every generation wrote lines of its own.
func TestAccessLogAcrossHotRestartUnderLoad(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	logPath := filepath.Join(t.TempDir(), "access.log")
	cfg := restartConfig("2s", "3s", "100ms", b.Addr)
	cfg.Extra = fmt.Sprintf("[[listeners.access_log]]\npath = %q\nformat = \"json\"\n\n", logPath) + cfg.Extra
	c := startChain(t, cfg)

	url := c.serving.URL("web", "/")
	var loads []*steadyLoad
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		loads = append(loads, startSteadyLoad(t, loadgen.Options{
			URL: url, Mode: mode, Clients: 3, Requests: 200, Timeout: 5 * time.Second, Check: backendCheck("b1"),
		}))
	}
	loads[0].WaitMore(t, 200)
	const restarts = 3
	for range restarts {
		_, parent := c.restart()
		loads[0].WaitMore(t, 200)
		loads[1].WaitMore(t, 100)
		waitExit0(t, parent, exitTimeout)
	}
	var total int64
	for _, l := range loads {
		res := l.Stop()
		t.Log(res)
		if res.Failed() != 0 {
			t.Fatalf("failed requests: %v", res)
		}
		total += res.Total()
	}
	answered := int(b.Requests())
	if int64(answered) != total {
		t.Fatalf("the backend answered %d requests, the clients made %d", answered, total)
	}
	lines := waitLines(t, logPath, answered)
	if len(lines) != answered {
		t.Fatalf("%d lines for %d requests", len(lines), answered)
	}
	epochs := map[float64]int{}
	for _, l := range lines {
		if l["RESPONSE_CODE"] != float64(200) || l["UPSTREAM_HOST"] != b.Addr {
			t.Fatalf("line %v", l)
		}
		epochs[l["EPOCH"].(float64)]++
	}
	if len(epochs) != restarts+1 {
		t.Errorf("lines by epoch %v: want lines of each of %d generations", epochs, restarts+1)
	}
	t.Logf("%d lines, by epoch %v", len(lines), epochs)
}

// TestAccessLogReopenOnSIGUSR1: after logrotate moves the file and sends
// SIGUSR1, new lines go to a new file at the path; none is lost.
func TestAccessLogReopenOnSIGUSR1(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	logPath := filepath.Join(t.TempDir(), "access.log")
	cfg := restartConfig("1s", "2s", "100ms", b.Addr)
	cfg.Extra = fmt.Sprintf("[[listeners.access_log]]\npath = %q\nformat = \"%%PATH%% %%RESPONSE_CODE%%\"\n\n", logPath) + cfg.Extra
	c := startChain(t, cfg)
	cl := newClient(5 * time.Second)
	for i := range 5 {
		get(t, cl, c.serving.URL("web", fmt.Sprintf("/before/%d", i)))
	}
	waitFileLines(t, logPath, 5)
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	c.serving.Signal(syscall.SIGUSR1)
	// The reopen creates the file: wait for it, not for a time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(logPath); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new file at %s after SIGUSR1\n%s", logPath, c.serving.Output())
		}
		time.Sleep(pollEvery)
	}
	for i := range 3 {
		get(t, cl, c.serving.URL("web", fmt.Sprintf("/after/%d", i)))
	}
	old, cur := waitFileLines(t, logPath+".1", 5), waitFileLines(t, logPath, 3)
	if len(old) != 5 || len(cur) != 3 || !strings.HasPrefix(old[4], "/before/4 200") || !strings.HasPrefix(cur[0], "/after/0 200") {
		t.Fatalf("rotated %q, new %q", old, cur)
	}
	if c.serving.Exited() {
		t.Fatal("SIGUSR1 stopped the generation")
	}
}

func waitFileLines(t testing.TB, path string, want int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		s := strings.TrimSuffix(string(b), "\n")
		var lines []string
		if s != "" {
			lines = strings.Split(s, "\n")
		}
		if len(lines) >= want || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(pollEvery)
	}
}
