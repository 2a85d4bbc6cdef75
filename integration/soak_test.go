package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// EnvSoakReloads turns TestSoak on (scripts/soak.sh sets it): the number
// of reloads. It is not part of make test: 1,000 reloads take minutes.
const EnvSoakReloads = "HOTPROXY_SOAK_RELOADS"

// processFigures are a process's leak indicators.
type processFigures struct {
	FDs, Goroutines int
	RSSKiB          int
}

func (f processFigures) String() string {
	return fmt.Sprintf("fds %d, goroutines %d, RSS %d KiB", f.FDs, f.Goroutines, f.RSSKiB)
}

func figuresOf(t *testing.T, pid, goroutines int) processFigures {
	t.Helper()
	f := processFigures{FDs: fdCount(t, pid), Goroutines: goroutines}
	st, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sc := bufio.NewScanner(st)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f.RSSKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return f
}

// servingFigures reads the serving generation's goroutines from its
// /server_info (the admin socket is handed over: the answer must come from
// pid) and the rest from /proc.
func servingFigures(t *testing.T, admin string, pid int) processFigures {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 50 {
		resp, err := c.Get("http://" + admin + "/server_info")
		if err == nil {
			var info struct {
				PID        int `json:"pid"`
				Goroutines int `json:"goroutines"`
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Unmarshal(b, &info) == nil && info.PID == pid {
				return figuresOf(t, pid, info.Goroutines)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the serving generation (pid %d) did not answer /server_info", pid)
	return processFigures{}
}

// tcpLoad opens a connection through a TCP listener, echoes a line and
// closes, over and over, counting failures.
type tcpLoad struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	examples   []string
}

func (l *tcpLoad) run(ctx context.Context, addr string) {
	for ctx.Err() == nil {
		err := func() error {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("soak\n")); err != nil {
				return err
			}
			buf := make([]byte, 5)
			_, err = io.ReadFull(c, buf)
			return err
		}()
		if err != nil && ctx.Err() == nil {
			l.failed.Add(1)
			l.mu.Lock()
			if len(l.examples) < 5 {
				l.examples = append(l.examples, err.Error())
			}
			l.mu.Unlock()
		} else if err == nil {
			l.ok.Add(1)
		}
	}
}

// TestSoak (issue 11; scripts/soak.sh): HOTPROXY_SOAK_RELOADS reloads at
// HOTPROXY_SOAK_INTERVAL (default 100ms) under HTTP keep-alive,
// connection-per-request and TCP load, with binary swaps at a quarter, a
// half and three quarters, and two reloads with a broken config. It
// reports failed requests, reload latency p50/p99/max, generations alive
// at most, and fds, goroutines and RSS of the supervisor and the serving
// generation at the start and the end; it fails on a failed request, a
// bound exceeded or a supervisor fd leak.
func TestSoak(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(EnvSoakReloads))
	if n <= 0 {
		t.Skipf("a soak run: set %s=1000 (scripts/soak.sh)", EnvSoakReloads)
	}
	interval := 100 * time.Millisecond
	if v := os.Getenv("HOTPROXY_SOAK_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("HOTPROXY_SOAK_INTERVAL=%q: %v", v, err)
		}
		interval = d
	}
	requireServeContract(t)
	next := buildVersion(t, "v-soak", t.TempDir())
	backend := harness.StartHTTPBackend(t, "b1")
	echo := harness.StartTCPEchoBackend(t)
	c := httpProxyConfig(backend.Addr)
	c.Listeners = append(c.Listeners, harness.Listener{Name: "tcp", Protocol: "tcp", Cluster: "echo"})
	c.Clusters = append(c.Clusters, harness.Cluster{Name: "echo", LBPolicy: "round_robin", Endpoints: []string{echo.Addr}, ConnectTimeout: "1s"})
	c = c.Allocate(t)
	s := startSupervised(t, supervisedOpts{Config: c.TOML()})
	supPID := s.supervisorPID()
	original := filepath.Join(t.TempDir(), "hotproxy-original")
	if b, err := os.ReadFile(s.bin); err != nil || os.WriteFile(original, b, 0o755) != nil {
		t.Fatalf("keeping the original binary: %v", err)
	}
	swapTo := func(src string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		tmp := s.bin + ".new"
		if err := os.WriteFile(tmp, b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, s.bin); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := "http://" + c.Listeners[0].Address + "/"
	var runs []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: 4, Duration: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(100, 10*time.Second) {
			t.Fatalf("%v load did not start: %v", mode, r.Snapshot())
		}
		runs = append(runs, r)
	}
	var tcp tcpLoad
	tcpCtx, tcpStop := context.WithCancel(ctx)
	var tcpWG sync.WaitGroup
	for range 2 {
		tcpWG.Add(1)
		go func() { defer tcpWG.Done(); tcp.run(tcpCtx, c.Listeners[1].Address) }()
	}

	st := s.mustStatus()
	g, _ := st.Serving()
	supStart, genStart := figuresOf(t, supPID, st.Goroutines), servingFigures(t, c.Admin, g.PID)

	alive := watchAlive(t, supPID)
	good, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var latencies []time.Duration
	var quarters []string
	failedReloads, swaps := 0, 0
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 1; i <= n; i++ {
		<-tick.C
		broken := i == n/3 || i == 2*n/3
		if broken {
			os.WriteFile(s.cfgPath, []byte("[server]\nconcurrency = \"two\"\n"), 0o644)
		}
		if i == n/4 || i == 3*n/4 {
			swapTo(next)
			swaps++
		} else if i == n/2 {
			swapTo(original)
			swaps++
		}
		res, took := reloadOnce(t, s)
		if broken {
			os.WriteFile(s.cfgPath, good, 0o644)
			if res.OK {
				t.Errorf("reload %d with a broken config succeeded: %+v", i, res)
			}
			failedReloads++
			continue
		}
		if !res.OK {
			t.Fatalf("reload %d: %+v\n", i, res)
		}
		latencies = append(latencies, took)
		if i%(max(1, n/4)) == 0 {
			// The trend, not one point: a Go heap grows to a plateau.
			st := s.mustStatus()
			quarters = append(quarters, fmt.Sprintf("after %d: %v", i, figuresOf(t, supPID, st.Goroutines)))
		}
	}
	maxAlive := alive.Stop()
	// Let the draining generations finish before the end figures.
	time.Sleep(3 * time.Second)
	st = s.mustStatus()
	g, _ = st.Serving()
	supEnd, genEnd := figuresOf(t, supPID, st.Goroutines), servingFigures(t, c.Admin, g.PID)

	var failed int64
	var loads []string
	for _, r := range runs {
		res := r.Stop()
		failed += res.Failed()
		loads = append(loads, res.String())
	}
	tcpStop()
	tcpWG.Wait()
	failed += tcp.failed.Load()
	loads = append(loads, fmt.Sprintf("tcp: %d connections echoed, %d failed %v", tcp.ok.Load(), tcp.failed.Load(), tcp.examples))

	slices.Sort(latencies)
	pct := func(p int) time.Duration { return latencies[max(0, (len(latencies)*p+99)/100-1)] }
	report := fmt.Sprintf(`soak: %d reloads every %v (%d with a broken config, refused; %d binary swaps)
  failed requests: %d
    %s
  reload latency: p50 %v, p99 %v, max %v
  generations alive at most: %d (bound %d)
  supervisor (pid %d):         start %v; end %v
    %s
  serving generation:          start %v (epoch %d); end %v (epoch %d)
`, n, interval, failedReloads, swaps, failed, strings.Join(loads, "\n    "),
		pct(50).Round(time.Millisecond), pct(99).Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond),
		maxAlive, maxAliveGenerations, supPID, supStart, supEnd, strings.Join(quarters, "\n    "), genStart, 0, genEnd, g.Epoch)
	fmt.Print(report)
	t.Log(report)
	if failed != 0 {
		t.Errorf("%d failed requests", failed)
	}
	if maxAlive > maxAliveGenerations {
		t.Errorf("%d generations alive at once, bound %d", maxAlive, maxAliveGenerations)
	}
	if supEnd.FDs != supStart.FDs {
		t.Errorf("supervisor fds: %d at the start, %d at the end", supStart.FDs, supEnd.FDs)
	}
	if code := s.stop(2 * time.Minute); code != 0 {
		t.Errorf("supervisor exit status %d", code)
	}
}
