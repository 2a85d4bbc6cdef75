package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
	"github.com/hotproxy/hotproxy/shm"
)

// TestHotRestart50UnderLoad is issue 4's first "done means": 50 hot
// restarts in a row, one every 200 ms, under continuous load, in keep-alive
// and in connection-per-request mode, with zero failed requests of any
// class (transport retries included), at most two generations alive at
// once, every old generation exiting 0 by itself, and (once the binary has
// stats) the region's request counter equal to what the clients counted.
func TestHotRestart50UnderLoad(t *testing.T) {
	for _, tc := range []struct {
		mode  loadgen.Mode
		round int
		floor int64
	}{
		{loadgen.KeepAlive, 2000, 5000},
		{loadgen.ConnPerRequest, 500, 2000},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			const restarts, period = 50, 200 * time.Millisecond
			b := harness.StartHTTPBackend(t, "b1")
			// commit_window is short so that an old generation is gone
			// before the next restart: at most two ever run at once.
			c := startChain(t, restartConfig("1s", "2s", "100ms", b.Addr))
			info0, _ := infoFrom(t, c.serving)
			if e, _ := info0.Int("epoch"); e != 0 {
				t.Fatalf("epoch 0 says epoch %d", e)
			}
			load := startSteadyLoad(t, loadgen.Options{
				URL: c.serving.URL("web", "/"), Mode: tc.mode, Clients: 4,
				Requests: tc.round, Timeout: 5 * time.Second, Check: backendCheck("b1"),
			})
			load.WaitMore(t, 200)

			probe := startReadyProbe(t, c.serving.AdminAddr)
			start := time.Now()
			lastUptime := uptimeAll(t, info0)
			var readyTimes, exitTimes []time.Duration
			adminFromOld := 0
			for i := 1; i <= restarts; i++ {
				if d := time.Until(start.Add(time.Duration(i-1) * period)); d > 0 {
					time.Sleep(d) // pacing, not synchronisation
				}
				child, parent := c.restart()
				readyTimes = append(readyTimes, child.ReadyAt().Sub(child.Exec))
				info, others := infoFrom(t, child)
				adminFromOld += others
				if e, _ := info.Int("epoch"); e != i {
					t.Fatalf("restart %d: /server_info epoch %d", i, e)
				}
				if st := info.String("state"); st != "LIVE" {
					t.Fatalf("restart %d: /server_info state %s", i, st)
				}
				if up := uptimeAll(t, info); up < lastUptime {
					t.Fatalf("restart %d: uptime_all_epochs went from %v to %v", i, lastUptime, up)
				} else {
					lastUptime = up
				}
				waitExit0(t, parent, exitTimeout)
				exitTimes = append(exitTimes, time.Since(child.Exec))
				if res := load.Snapshot(); res.Failed() != 0 {
					t.Fatalf("restart %d: failures: %v", i, res)
				}
			}
			elapsed := time.Since(start)
			load.WaitMore(t, 200) // the newest generation serves on
			res := load.Stop()
			probes := probe.stop()
			t.Logf("admin /ready polled %d times across the restarts: %v", probes.total, probes.bad)
			if len(probes.bad) != 0 || probes.total < 100 {
				t.Errorf("the admin address must answer /ready 200 throughout the restarts (a health checker's view): %d polls, not 200: %v", probes.total, probes.bad)
			}

			t.Logf("%d restarts in %v; load: %v", restarts, elapsed.Round(time.Millisecond), res)
			t.Logf("exec->READY p50 %v max %v; exec->old generation exited p50 %v max %v; %d /server_info answers came from the old generation",
				pct(readyTimes, 50), pct(readyTimes, 100), pct(exitTimes, 50), pct(exitTimes, 100), adminFromOld)
			if res.Failed() != 0 {
				t.Errorf("%d failed requests: %v", res.Failed(), res)
			}
			if res.Total() < tc.floor {
				t.Errorf("only %d requests ran across the restarts, want at least %d", res.Total(), tc.floor)
			}
			if c.maxLive > 2 {
				t.Errorf("%d generations were alive at once, want at most 2", c.maxLive)
			}
			if up := uptimeAll(t, mustInfo(t, c.serving)); up < elapsed.Truncate(time.Second)-time.Second {
				t.Errorf("uptime_all_epochs %v after %v of restarts", up, elapsed)
			}
			for _, g := range c.gens[:len(c.gens)-1] {
				if !g.Exited() {
					t.Errorf("epoch %d (pid %d) still runs", g.Epoch, g.PID())
				}
			}
			checkRqTotal(t, c.serving, "web", res.Total())
		})
	}
}

func mustInfo(t *testing.T, g *harness.Generation) harness.ServerInfo {
	t.Helper()
	info, _ := infoFrom(t, g)
	return info
}

// pct returns the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (p*len(s) + 99) / 100
	return s[max(i, 1)-1]
}

// TestHotRestartNoLeaks: after 100 hot restarts, the newest generation's
// open fds and goroutines are what a fresh epoch 0 of the same config has,
// measured the same way (no client connection open, the previous
// generation gone); no restart socket or process is left behind, and (with
// stats) the region has one live owner with concurrency+1 lanes.
func TestHotRestartNoLeaks(t *testing.T) {
	const restarts = 100
	b := harness.StartHTTPBackend(t, "b1")
	cfg := restartConfig("1s", "2s", "20ms", b.Addr)

	fresh := startChain(t, cfg)
	fdsFresh, grFresh := settledCounts(t, fresh.serving)

	c := startChain(t, cfg)
	client := newClient(5 * time.Second)
	var fdsEpoch1, grEpoch1 int
	for i := 1; i <= restarts; i++ {
		child, parent := c.restart()
		waitExit0(t, parent, exitTimeout)
		if i == 1 {
			fdsEpoch1, grEpoch1 = settledCounts(t, child)
		}
		if i%10 == 0 { // a request now and then, through the newest
			if pid := getPID(t, client, child.URL("web", "/pid")); pid != child.PID() {
				t.Fatalf("epoch %d: /pid answered by %d, want %d", i, pid, child.PID())
			}
		}
	}
	client.CloseIdleConnections()
	newest := c.serving
	fds, gr := settledCounts(t, newest)
	t.Logf("fresh epoch 0: %d fds, %d goroutines; epoch 1: %d fds, %d goroutines; epoch %d: %d fds, %d goroutines",
		fdsFresh, grFresh, fdsEpoch1, grEpoch1, newest.Epoch, fds, gr)
	if fds != fdsFresh {
		t.Errorf("epoch %d has %d open fds, a fresh start %d (epoch 1: %d)\nfresh (pid %d):\n%s\nepoch %d (pid %d):\n%s",
			newest.Epoch, fds, fdsFresh, fdsEpoch1, fresh.serving.PID(), fdList(fresh.serving.PID()), newest.Epoch, newest.PID(), fdList(newest.PID()))
	}
	if gr != grFresh {
		t.Errorf("epoch %d has %d goroutines, a fresh start %d (epoch 1: %d)", newest.Epoch, gr, grFresh, grEpoch1)
	}
	for _, g := range c.gens[:len(c.gens)-1] {
		if !g.Exited() {
			t.Errorf("epoch %d (pid %d) still runs", g.Epoch, g.PID())
		}
	}
	want := []string{fmt.Sprintf("@hotproxy.%d.%d", c.baseID, newest.Epoch)}
	if got := restartSockets(t, c.baseID); !slices.Equal(got, want) {
		t.Errorf("restart sockets bound: %q, want only %q", got, want)
	}
	checkRegionOwners(t, c, newest, testConcurrency+1)
}

// settledCounts reads open_fds and goroutines from g's /server_info with
// no client connection open, until they have not changed for a second
// (bounded): a worker parks the goroutine of a connection that ended, for
// the next one, and retires it within half a second (workers/servepool.go).
func settledCounts(t *testing.T, g *harness.Generation) (fds, goroutines int) {
	t.Helper()
	prevF, prevG := -1, -1
	var since time.Time
	for i := 0; i < 500; i++ {
		info, _ := infoFrom(t, g)
		f, ok1 := info.Int("open_fds")
		n, ok2 := info.Int("goroutines")
		if !ok1 || !ok2 {
			t.Fatalf("/server_info lacks open_fds or goroutines: %v", info)
		}
		if f != prevF || n != prevG {
			prevF, prevG, since = f, n, time.Now()
		} else if time.Since(since) >= time.Second {
			return f, n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("epoch %d: open_fds and goroutines never settled (last %d, %d)", g.Epoch, prevF, prevG)
	return 0, 0
}

// checkRegionOwners opens the chain's stats region with the shm reader and
// asserts exactly one live owner, newest, with lanes lanes: no owner slot
// or lane leaked by the generations before it.
func checkRegionOwners(t *testing.T, c *chain, newest *harness.Generation, lanes int) {
	t.Helper()
	if _, err := os.Stat(c.statsPath); err != nil {
		t.Errorf("stats: the config names %s but it is not there: %v", c.statsPath, err)
		return
	}
	r, err := shm.OpenReader(c.statsPath)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	defer r.Close()
	snap, err := r.Snapshot()
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	var live []shm.Owner
	for _, o := range snap.Owners {
		if o.State != shm.OwnerFree {
			live = append(live, o)
		}
	}
	if len(live) != 1 || live[0].PID != newest.PID() || live[0].State != shm.OwnerLive || live[0].Lanes != lanes {
		t.Errorf("stats: owners %+v, want one live owner pid %d with %d lanes", live, newest.PID(), lanes)
	} else {
		t.Logf("stats: one live owner (pid %d, epoch %d, %d lanes)", live[0].PID, live[0].Epoch, live[0].Lanes)
	}
}

// fdList describes the open fds of pid, one a line; a Unix socket gets its
// type and peer state from /proc/net/unix, for leak reports.
func fdList(pid int) string {
	unixSocks := map[string]string{} // inode -> "type T state S path"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) >= 7 {
				desc := "unix type " + fs[4] + " state " + fs[5]
				if len(fs) >= 8 {
					desc += " " + fs[7]
				}
				unixSocks[fs[6]] = desc
			}
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join(dir, e.Name()))
		fmt.Fprintf(&b, "  %s -> %s", e.Name(), l)
		if d, ok := unixSocks[strings.Trim(strings.TrimPrefix(l, "socket:"), "[]")]; ok {
			fmt.Fprintf(&b, " (%s)", d)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// readyProbe polls GET /ready on the (shared) admin address as fast as it
// answers, counting what is not a 200: what a load balancer's health check
// would see across the restarts.
type readyProbe struct {
	stopc chan struct{}
	done  chan readyProbeResult
}

type readyProbeResult struct {
	total int
	bad   map[string]int // "503 Service Unavailable: DRAINING", transport errors, ...
}

func startReadyProbe(t testing.TB, addr string) *readyProbe {
	p := &readyProbe{stopc: make(chan struct{}), done: make(chan readyProbeResult, 1)}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	go func() {
		r := readyProbeResult{bad: map[string]int{}}
		for {
			select {
			case <-p.stopc:
				p.done <- r
				return
			default:
			}
			r.total++
			resp, err := client.Get("http://" + addr + "/ready")
			if err != nil {
				r.bad[loadgen.Classify(err, false).String()]++
			} else {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					r.bad[resp.Status+": "+strings.TrimSpace(string(body))]++
				}
			}
			time.Sleep(2 * time.Millisecond) // a fast health checker, not a busy loop
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

func (p *readyProbe) stop() readyProbeResult {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
	r, ok := <-p.done
	if !ok {
		return readyProbeResult{}
	}
	close(p.done)
	return r
}
