package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// slowBackendMS is the fixed delay of the backend in TestStatsNDJSONIntervalQuantiles.
const slowBackendMS = 80

// TestStatsNDJSONIntervalQuantiles runs a real proxy in front of a backend
// that answers every request after 80ms, and `hotproxy stats --watch
// --format ndjson`: once the load runs, a line's interval quantiles of
// listener.web.downstream_rq_time are about 80ms, although the histogram
// since start is dominated by fast requests sent before (whose p50 is a
// few ms at most), so they are the interval's alone. `hotproxy top`
// against the same region shows the same latency in the listener's row.
func TestStatsNDJSONIntervalQuantiles(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "slow")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	region := harness.StatsPath(t)

	// History: fast requests, flushed into the region (every 1s).
	const fast = 200
	sendRequests(t, p, fast)
	waitCLIHistogramCount(t, region, "listener.web.downstream_rq_time", fast, 10*time.Second)

	cmd := exec.Command(harness.Binary(t), "stats", "--path", region, "--watch", "500ms", "--format", "ndjson",
		"--filter", `^listener\.web\.downstream_rq_time$`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 256)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only the watcher this test started
		for range lines {
		}
		_ = cmd.Wait()
	})

	// Load: 4 clients sending slow requests until the test is done.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	url := p.URL("web", "/slow?ms="+strconv.Itoa(slowBackendMS))
	// The slowest request a client saw: the proxy's own quantiles cannot
	// be above it, however loaded the machine is (it took 148ms at p90
	// on a loaded one, for a backend that waits 80ms).
	var slowestSeen atomic.Int64
	var completed [4]atomic.Int64 // per client
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
			defer c.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				default:
				}
				began := time.Now()
				resp, err := c.Get(url)
				if err != nil {
					continue
				}
				resp.Body.Close()
				took := time.Since(began).Nanoseconds()
				for seen := slowestSeen.Load(); took > seen && !slowestSeen.CompareAndSwap(seen, took); seen = slowestSeen.Load() {
				}
				completed[i].Add(1)
			}
		}()
	}

	type ndLine struct {
		Interval float64 `json:"interval_seconds"`
		Stats    []struct {
			Name      string `json:"name"`
			Histogram struct {
				Count     uint64             `json:"count"`
				Quantiles map[string]float64 `json:"quantiles"`
				Rate      *float64           `json:"rate"`
				Interval  *struct {
					Count     uint64             `json:"count"`
					Quantiles map[string]float64 `json:"quantiles"`
				} `json:"interval"`
			} `json:"histogram"`
		} `json:"stats"`
	}
	deadline := time.After(30 * time.Second)
	for {
		var raw string
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("hotproxy stats --watch --format ndjson ended early")
			}
			raw = l
		case <-deadline:
			t.Fatal("no ndjson line with 10 slow requests in its interval within 30s")
		}
		var l ndLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("not a JSON line: %v: %q", err, raw)
		}
		if len(l.Stats) != 1 || l.Stats[0].Name != "listener.web.downstream_rq_time" {
			t.Fatalf("--filter selected %q", raw)
		}
		h := l.Stats[0].Histogram
		if h.Interval == nil || h.Interval.Count < 10 || h.Count < fast+10 {
			continue // the first line, or an interval before the load shows
		}
		t.Logf("ndjson line: %s", raw)
		if p50 := h.Quantiles["0.5"]; p50 > slowBackendMS/4 {
			t.Fatalf("since-start p50 %.1fms: the fast history does not dominate, so the test proves nothing", p50)
		}
		// At least the backend's 80ms (the fast history would pull them
		// down), at most the slowest request a client measured; buckets
		// are 13.6% wide, interpolated.
		// A request the proxy counted may still be on its way to its
		// client: wait until every client has finished one more.
		var at [4]int64
		for i := range completed {
			at[i] = completed[i].Load()
		}
		for i := range completed {
			for wait := time.Now().Add(10 * time.Second); completed[i].Load() == at[i]; {
				if time.Now().After(wait) {
					t.Fatalf("client %d finished no request in 10s", i)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		ceiling := float64(slowestSeen.Load())/float64(time.Millisecond)*1.14 + 1
		for _, q := range []string{"0.5", "0.9", "0.99"} {
			v := h.Interval.Quantiles[q]
			if v < slowBackendMS*0.9 || v > ceiling {
				t.Errorf("interval quantile %s = %.1fms, want between %dms (the backend's fixed delay) and %.1fms (the slowest request a client saw, plus a bucket)",
					q, v, slowBackendMS*9/10, ceiling)
			}
		}
		if h.Rate == nil || *h.Rate <= 0 {
			t.Errorf("interval rate %v, want > 0", h.Rate)
		}
		break
	}

	// The same region in `hotproxy top`: the listener's row shows the
	// interval's latency, about 80ms.
	res := harness.Run(t, "top", "--path", region, "--frames", "3", "--interval", "1200ms", "--size", "120x30")
	if res.Code != 0 {
		t.Fatalf("hotproxy top: exit %d: %s", res.Code, res.Stderr)
	}
	frames := strings.Split(res.Stdout, "\f\n")
	last := frames[len(frames)-2]
	row := regexp.MustCompile(`(?m)^web +\S+/s +\S+ +\d+ +.+?/s +.+?/s +(\S+)ms +\S+ +\S+`).FindStringSubmatch(last)
	if row == nil {
		t.Fatalf("hotproxy top: no web row with a p50 in ms:\n%s", last)
	}
	if v, _ := strconv.ParseFloat(row[1], 64); v < slowBackendMS*0.9 || v > slowBackendMS*1.6 {
		t.Errorf("hotproxy top: web p50 %sms, want about %dms:\n%s", row[1], slowBackendMS, last)
	}
	for _, want := range []string{"GENERATIONS", "LISTENERS", "CLUSTERS", "backend"} {
		if !strings.Contains(last, want) {
			t.Errorf("hotproxy top frame lacks %q:\n%s", want, last)
		}
	}

	// A wedged proxy (stopped): top still draws, from the region alone.
	p.Signal(syscall.SIGSTOP)
	defer p.Signal(syscall.SIGCONT)
	wedged := harness.Run(t, "top", "--path", region, "--frames", "2", "--interval", "100ms", "--size", "120x30")
	if wedged.Code != 0 || !regexp.MustCompile(`(?m)^web `).MatchString(wedged.Stdout) {
		t.Errorf("hotproxy top against a stopped proxy: exit %d:\n%s%s", wedged.Code, wedged.Stdout, wedged.Stderr)
	}
}

// waitCLIHistogramCount waits until `hotproxy stats --format json` shows
// histogram name with at least want samples.
func waitCLIHistogramCount(t *testing.T, region, name string, want uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		res := statsCLI(t, 0, "--path", region, "--format", "json", "--filter", "^"+regexp.QuoteMeta(name)+"$")
		var doc struct {
			Stats []struct {
				Histogram *struct {
					Count uint64 `json:"count"`
				} `json:"histogram"`
			} `json:"stats"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Stats) == 1 && doc.Stats[0].Histogram != nil && doc.Stats[0].Histogram.Count >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has fewer than %d samples after %v: %s", name, want, timeout, res.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
