package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestTimerSlackOnEveryThread: server.timer_slack (default 1ms) is the
// timer slack of every thread of a generation, the Go runtime's sysmon
// among them, including threads the runtime made once it served. Before
// it, every thread had the kernel's 50us, and sysmon woke every ~70us on
// the busy core (docs/benchmarks.md).
func TestTimerSlackOnEveryThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a generation sets its other threads' timer slack with root or CAP_SYS_NICE; the unprivileged path (inherited from the supervisor) is TestSuperviseAsUnprivilegedUser's")
	}
	for _, tc := range []struct {
		set  string
		want time.Duration
	}{{"", time.Millisecond}, {"3ms", 3 * time.Millisecond}} {
		t.Run("timer_slack="+tc.set, func(t *testing.T) {
			c := harness.Config{TimerSlack: tc.set, Listeners: []harness.Listener{{
				Name: "web", Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "hello"}},
			}}}.Allocate(t)
			p := harness.StartProxy(t, c.TOML())
			for range 20 {
				resp, err := http.Get(p.URL("web", "/"))
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			checkTimerSlack(t, p.PID(), tc.want)
		})
	}
}

// checkTimerSlack fails t unless every thread of process pid has the
// timer slack want.
func checkTimerSlack(t *testing.T, pid int, want time.Duration) {
	t.Helper()
	slacks, err := threadTimerSlacks(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(slacks) < 2 {
		t.Fatalf("process %d has %d threads; a Go process has more", pid, len(slacks))
	}
	for tid, got := range slacks {
		if got != want {
			t.Errorf("process %d, thread %d: timer slack %v, want %v", pid, tid, got, want)
		}
	}
}

// threadTimerSlacks reads the timer slack of every thread of pid.
func threadTimerSlacks(pid int) (map[int]time.Duration, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	slacks := map[int]time.Duration{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid))
		if err != nil {
			return nil, fmt.Errorf("thread %d of %d: %w", tid, pid, err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("thread %d of %d: %q: %w", tid, pid, b, err)
		}
		slacks[tid] = time.Duration(ns)
	}
	return slacks, nil
}
