package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/workers"
	"github.com/hotproxy/hotproxy/workers/steering"
)

// lockedBuffer is a log sink safe for the logger's writes and the test's
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestOverloadTriggers drives the overload manager's passes with a fake
// connections monitor: a threshold acts from its pressure on, a scaled
// range by degrees, the workers get the state, the stats and the report
// say so, and a flapping action is logged once per interval.
func TestOverloadTriggers(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[server]
concurrency = 1
[admin]
address = "127.0.0.1:0"
[overload.stop_accepting]
monitors = ["connections"]
pressure_percent = [50]
[overload.shrink_timeouts]
monitors = ["connections"]
pressure_percent = [40, 80]
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "ok" }
`, freeAddr(t))), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	isolateStats(t, cfg)
	var logs lockedBuffer
	srv, err := New(Options{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	om := srv.overload
	if om == nil {
		t.Fatal("[overload] actions configured and no overload manager")
	}
	pressure := 0.0
	for _, m := range om.monitors {
		if m.name == config.MonitorConnections {
			m.read = func() (float64, uint64, uint64, error) { return pressure, uint64(pressure * 100), 100, nil }
		}
		if m.watched != (m.name == config.MonitorConnections) {
			t.Errorf("monitor %s watched = %v", m.name, m.watched)
		}
	}
	gauge := func(name string) int64 { return srv.stats.Gauge(name, stats.GaugeNewest).Value() }
	now := time.Now()
	step := func(p float64) {
		pressure = p
		now = now.Add(time.Second)
		om.pass(now)
	}

	step(0.3)
	if gauge("overload.stop_accepting.active") != 0 || gauge("overload.shrink_timeouts.active") != 0 || (om.lastState != workers.OverloadState{RetryAfter: om.lastState.RetryAfter}) {
		t.Fatalf("at 30%%: something acts: %+v", om.lastState)
	}
	step(0.6) // stop_accepting from 50%; shrink_timeouts half-way from 40 to 80
	if gauge("overload.stop_accepting.active") != 1 || !om.lastState.StopAccepting {
		t.Errorf("at 60%%: stop_accepting not acting (%+v)", om.lastState)
	}
	if got := gauge("overload.shrink_timeouts.scale_percent"); got != 50 {
		t.Errorf("at 60%%: shrink_timeouts.scale_percent = %d, want 50", got)
	}
	// Half-way to timeout_min_percent (10): 100 - 0.5*90 = 55.
	if om.lastState.TimeoutPercent != 55 {
		t.Errorf("at 60%%: timeouts at %d%%, want 55%%", om.lastState.TimeoutPercent)
	}
	if got := gauge("overload.monitor.connections.pressure_percent"); got != 60 {
		t.Errorf("pressure gauge = %d, want 60", got)
	}
	rep := om.report.Load()
	if len(rep.Actions) != 2 || !rep.Actions[0].Active || rep.Actions[0].Name != config.ActionStopAccepting || rep.Actions[1].ScalePercent != 50 {
		t.Errorf("report: %+v", rep.Actions)
	}

	// Flapping within overloadLogEvery: one start, the changes held back
	// and logged, with their count, once the interval is over.
	for range 4 {
		pressure = 0.3
		now = now.Add(100 * time.Millisecond)
		om.pass(now)
		pressure = 0.6
		now = now.Add(100 * time.Millisecond)
		om.pass(now)
	}
	step(0.1)
	now = now.Add(overloadLogEvery)
	om.pass(now)
	out := logs.String()
	if n := strings.Count(out, "overload action started: action=stop_accepting"); n != 1 {
		t.Errorf("stop_accepting's start logged %d times, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "overload action stopped: action=stop_accepting"); n != 1 || !strings.Contains(out, "changes_held_back=") {
		t.Errorf("stop_accepting's stop logged %d times (want 1, with changes_held_back):\n%s", n, out)
	}
	if (om.lastState != workers.OverloadState{RetryAfter: om.lastState.RetryAfter}) || gauge("overload.stop_accepting.active") != 0 {
		t.Errorf("at 10%%: still acting: %+v", om.lastState)
	}
}

// TestOverloadStopAcceptingReport: GET /overload says how stop_accepting
// refuses (in the kernel where the steering program is loaded, else at
// accept) and counts it; with the program, a connection refused while the
// action acts is in the report after the next pass.
func TestOverloadStopAcceptingReport(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[server]
concurrency = 2
[admin]
address = "127.0.0.1:0"
[overload.stop_accepting]
monitors = ["connections"]
pressure_percent = [50]
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "ok" }
`, freeAddr(t))), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	isolateStats(t, cfg)
	var logs lockedBuffer
	srv, err := New(Options{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	om := srv.overload
	pressure := 0.0
	for _, m := range om.monitors {
		if m.name == config.MonitorConnections {
			m.read = func() (float64, uint64, uint64, error) { return pressure, uint64(pressure * 100), 100, nil }
		}
	}
	want := workers.StopAcceptingAccept
	if err := steering.Probe(); err == nil {
		want = workers.StopAcceptingKernel
	} else if os.Geteuid() == 0 {
		t.Fatalf("root, but the steering program does not load: %v", err)
	}
	report := func() OverloadReport {
		t.Helper()
		rec := httptest.NewRecorder()
		srv.handleOverload(rec, httptest.NewRequest(http.MethodGet, "/overload", nil))
		var r OverloadReport
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("GET /overload: %v: %s", err, rec.Body.Bytes())
		}
		if r.StopAccepting == nil {
			t.Fatalf("GET /overload has no stop_accepting: %s", rec.Body.Bytes())
		}
		return r
	}
	now := time.Now()
	pressure = 0.6
	om.pass(now)
	r := report()
	if r.StopAccepting.Mode != want || r.StopAccepting.Listeners["web"] != want {
		t.Errorf("GET /overload stop_accepting: %+v, want mode %q", r.StopAccepting, want)
	}
	if !strings.Contains(logs.String(), "stop_accepting="+want) {
		t.Errorf("the overload manager's start line does not say stop_accepting=%s:\n%s", want, logs.String())
	}
	if want != workers.StopAcceptingKernel {
		return // accept mode: counted by the accept loops (workers' tests)
	}
	c, err := net.DialTimeout("tcp", srv.workers.Addr("web").String(), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a new connection completed its handshake while stop_accepting acts in the kernel")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while stop_accepting acts: %v, want connection refused", err)
	}
	om.pass(now.Add(time.Second))
	if r := report(); r.StopAccepting.RefusedInKernel != 1 || r.StopAccepting.ClosedAtAccept != 0 {
		t.Errorf("GET /overload after one refusal: %+v, want refused_in_kernel 1, closed_at_accept 0", r.StopAccepting)
	}
	if got := srv.stats.Counter("overload.shed_total").Value(); got != 1 {
		t.Errorf("overload.shed_total = %d, want 1", got)
	}
	pressure = 0.1
	om.pass(now.Add(2 * time.Second))
	c, err = net.DialTimeout("tcp", srv.workers.Addr("web").String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial once stop_accepting stopped: %v, want a connection", err)
	}
	c.Close()
}
