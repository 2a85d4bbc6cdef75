package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// BenchmarkHotRestart measures b.N hot restarts of a default-like config
// (the embedded default's shape: one http listener answering from the
// proxy, one worker per CPU, default drain_time) on free ports, with no
// load: exec of the child -> READY on its ready fd, exec -> the parent has
// drained (from its log), exec -> the parent has exited. The parent exits
// once it has drained and the commit window has passed; the window is set
// to 50ms here (default 5s) so that 50 restarts take seconds, not minutes.
// The bar (issue 4): READY within 100ms of exec. Run it with
// scripts/restart-bench.sh, or:
//
//	go test -run '^$' -bench 'BenchmarkHotRestart$' -benchtime 50x ./integration/
func BenchmarkHotRestart(b *testing.B) {
	const commitWindow = 50 * time.Millisecond
	cfg := harness.Config{
		Listeners: []harness.Listener{{
			Name:   "default",
			Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "hotproxy %VERSION% epoch %EPOCH% pid %PID%\n"}},
		}},
		Extra: fmt.Sprintf("[hot_restart]\ncommit_window = %q\n", commitWindow.String()),
	}
	c := startChain(b, cfg)
	var ready, drained, exited []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		child, parent := c.restart()
		ready = append(ready, child.ReadyAt().Sub(child.Exec))
		waitExit0(b, parent, exitTimeout)
		exited = append(exited, time.Since(child.Exec))
		at, err := logTime(parent.Stderr(), "drained after the hand-over")
		if err != nil {
			b.Fatalf("epoch %d: %v\n%s", parent.Epoch, err, parent.Output())
		}
		drained = append(drained, at.Sub(child.Exec))
	}
	b.StopTimer()
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"ready", ready}, {"drained", drained}, {"exited", exited}} {
		b.ReportMetric(msOf(pct(m.ds, 50)), m.name+"-p50-ms")
		b.ReportMetric(msOf(pct(m.ds, 99)), m.name+"-p99-ms")
	}
	b.Logf("%d restarts (commit_window %v): exec->READY p50 %v p99 %v; exec->parent drained p50 %v p99 %v; exec->parent exited p50 %v p99 %v",
		b.N, commitWindow, pct(ready, 50), pct(ready, 99), pct(drained, 50), pct(drained, 99), pct(exited, 50), pct(exited, 99))
	if p99 := pct(ready, 99); p99 > 100*time.Millisecond {
		b.Logf("over the bar: exec->READY p99 %v > 100ms", p99)
	}
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var logTimestamp = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z)`)

// logTime returns the timestamp of the first log line containing msg.
func logTime(stderr, msg string) (time.Time, error) {
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		m := logTimestamp.FindStringSubmatch(line)
		if m == nil {
			return time.Time{}, fmt.Errorf("log line without a timestamp: %q", line)
		}
		return time.Parse("2006-01-02T15:04:05.999999999Z", m[1])
	}
	return time.Time{}, fmt.Errorf("no log line with %q", msg)
}
