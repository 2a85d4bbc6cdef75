package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
	"github.com/hotproxy/hotproxy/shm"
)

// Bounds of the hot-restart tests' waits. None is a synchronisation by
// sleeping: each bounds a wait on something observable.
const (
	readyFDTimeout = 10 * time.Second // exec to READY on the ready fd
	exitTimeout    = 10 * time.Second // a generation that must exit by itself
	pollEvery      = 5 * time.Millisecond
)

var baseIDs atomic.Int64

// newBaseID returns a base-id no other test (or test process) uses: the
// test process's pid and a counter, so restart sockets never collide.
func newBaseID() int {
	return os.Getpid()<<8 | int(baseIDs.Add(1)&0xff)
}

// restartConfig is an http listener "web" (GET /pid answers the serving
// generation's pid; everything else goes to the cluster "backend") with
// hot-restart timings for chains of restarts.
func restartConfig(drain, parentShutdown, commit string, backend string) harness.Config {
	cfg := httpProxyConfig(backend)
	cfg.DrainTime = drain
	cfg.ParentShutdownTime = parentShutdown
	cfg.Listeners[0].Routes = append([]harness.Route{{Path: "/pid", Status: 200, Body: "%PID%"}}, cfg.Listeners[0].Routes...)
	cfg.Extra = fmt.Sprintf("[hot_restart]\ncommit_window = %q\n", commit)
	return cfg
}

// chain is one hotproxy instance (a base-id) going through hot restarts:
// every generation it started, in order.
type chain struct {
	t       testing.TB
	cfgPath string
	baseID  int
	// statsPath is the chain's stats region file.
	statsPath string
	gens      []*harness.Generation
	// serving is the newest generation that became ready.
	serving *harness.Generation
	maxLive int // most generations alive at once, seen at each launch
}

// startChain allocates ports for cfg, puts its stats region in a temporary
// directory, and starts epoch 0, retrying
// once with fresh ports if it lost a port race.
func startChain(t testing.TB, cfg harness.Config) *chain {
	t.Helper()
	c := &chain{t: t, baseID: newBaseID()}
	tbl, path := statsTable(t)
	cfg.Extra += "\n" + tbl
	c.statsPath = path
	for attempt := 0; ; attempt++ {
		c.cfgPath = writeConfigFile(t, cfg.Allocate(t).TOML())
		g := c.launch(0, harness.LaunchOptions{})
		err := g.WaitReadyFD(readyFDTimeout)
		if err == nil {
			c.serving = g
			return c
		}
		g.Wait(exitTimeout) // a failed start exits: then its stderr is complete
		if attempt == 0 && g.Exited() && strings.Contains(strings.ToLower(g.Stderr()), "address already in use") {
			c.gens = nil
			continue
		}
		t.Fatalf("epoch 0: %v\n%s", err, g.Output())
	}
}

// writeConfigFile writes cfg as it is (no table added) to a new file in
// the test's temporary directory, readable by every user (the uid test runs
// a generation as nobody), and returns its path.
func writeConfigFile(t testing.TB, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hotproxy.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// launch starts a generation of the chain at epoch without waiting.
func (c *chain) launch(epoch int, opts harness.LaunchOptions) *harness.Generation {
	c.t.Helper()
	live := 1
	for _, g := range c.gens {
		if !g.Exited() {
			live++
		}
	}
	c.maxLive = max(c.maxLive, live)
	g := harness.StartGeneration(c.t, c.cfgPath, c.baseID, epoch, opts)
	c.gens = append(c.gens, g)
	return g
}

// restart starts the next epoch, waits for READY on its ready fd and
// returns the new generation and the one it took over from.
func (c *chain) restart() (child, parent *harness.Generation) {
	c.t.Helper()
	parent = c.serving
	c.waitRoomToStart()
	child = c.launch(parent.Epoch+1, harness.LaunchOptions{})
	if err := child.WaitReadyFD(readyFDTimeout); err != nil {
		c.t.Fatalf("restart to epoch %d: %v\n%s", child.Epoch, err, child.Output())
	}
	c.serving = child
	return child, parent
}

// waitRoomToStart waits, as the supervisor does (machine.roomToStart),
// until starting one more generation leaves it an owner slot in the stats
// region: a chain restarted every 100 ms on a loaded machine can have
// more generations still draining than the region has slots, and the
// next one then refuses to start ("no free owner slot", seen once in
// TestTLSReloadStorm). Each draining generation exits within its
// parent_shutdown_time, so the wait is bounded by exitTimeout.
func (c *chain) waitRoomToStart() {
	c.t.Helper()
	for {
		var live []*harness.Generation
		for _, g := range c.gens {
			if !g.Exited() {
				live = append(live, g)
			}
		}
		if len(live) < shm.DefaultMaxOwners {
			return
		}
		if _, err := live[0].Wait(exitTimeout); err != nil {
			c.t.Fatalf("%d generations alive, the stats region has %d owner slots, and the oldest (epoch %d) did not exit: %v\n%s",
				len(live), shm.DefaultMaxOwners, live[0].Epoch, err, live[0].Output())
		}
	}
}

// waitExit0 waits for g to exit by itself and fails unless it exits 0.
func waitExit0(t testing.TB, g *harness.Generation, within time.Duration) {
	t.Helper()
	code, err := g.Wait(within)
	if err != nil {
		t.Fatalf("epoch %d: %v\n%s", g.Epoch, err, g.Output())
	}
	if code != 0 {
		t.Fatalf("epoch %d (pid %d) exited %d, want 0\n%s", g.Epoch, g.PID(), code, g.Output())
	}
}

// infoFrom polls GET /server_info on the shared admin address until the
// answer comes from g's pid (the admin socket is shared between
// generations: right after a hand-over the old generation may still
// answer a request or two). It returns the info and how many answers came
// from another generation first.
func infoFrom(t testing.TB, g *harness.Generation) (harness.ServerInfo, int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	others := 0
	for {
		resp, body, err := g.AdminDo(http.MethodGet, "/server_info")
		if err == nil && resp.StatusCode == http.StatusOK {
			var info harness.ServerInfo
			if err := json.Unmarshal(body, &info); err != nil {
				t.Fatalf("GET /server_info: %v: %s", err, body)
			}
			if pid, _ := info.Int("pid"); pid == g.PID() {
				return info, others
			}
			others++
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /server_info: no answer from epoch %d (pid %d) within 5s (%d from others, last error %v)", g.Epoch, g.PID(), others, err)
		}
		time.Sleep(pollEvery)
	}
}

// uptimeAll reads uptime_all_epochs ("12s") from info.
func uptimeAll(t testing.TB, info harness.ServerInfo) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(info.String("uptime_all_epochs"))
	if err != nil {
		t.Fatalf("uptime_all_epochs %q: %v", info.String("uptime_all_epochs"), err)
	}
	return d
}

// getPID sends GET /pid through the listener and returns the pid that
// answered.
func getPID(t *testing.T, c *http.Client, url string) int {
	t.Helper()
	resp, body := get(t, c, url)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(body))
	if err != nil {
		t.Fatalf("GET %s: body %q is not a pid", url, body)
	}
	return pid
}

// statsTable is a [stats] table putting the chain's region in a temporary
// directory, and the region's path.
func statsTable(t testing.TB) (table, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "region.stats")
	return fmt.Sprintf("[stats]\npath = %q\nflush_interval = \"100ms\"\n", path), path
}

// statsDoc is the part of GET /stats?format=json the tests read.
type statsDoc struct {
	Owners []struct {
		State string `json:"state"`
		PID   int    `json:"pid"`
		Epoch uint64 `json:"epoch"`
		Lanes int    `json:"lanes"`
	} `json:"owners"`
	Stats []struct {
		Name    string  `json:"name"`
		Counter *uint64 `json:"counter"`
	} `json:"stats"`
}

// counter returns the named counter and whether it is there.
func (d *statsDoc) counter(name string) (uint64, bool) {
	for _, s := range d.Stats {
		if s.Name == name && s.Counter != nil {
			return *s.Counter, true
		}
	}
	return 0, false
}

// adminStats GETs /stats?format=json from g.
func adminStats(t testing.TB, g *harness.Generation) *statsDoc {
	t.Helper()
	resp, body, err := g.AdminDo(http.MethodGet, "/stats?format=json")
	if err != nil {
		t.Fatalf("GET /stats?format=json: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /stats?format=json: %s: %.500s", resp.Status, body)
	}
	doc := new(statsDoc)
	if err := json.Unmarshal(body, doc); err != nil {
		t.Fatalf("GET /stats?format=json: %v: %.500s", err, body)
	}
	return doc
}

// checkRqTotal asserts that the region's listener.<name>.downstream_rq_total
// equals want. Counters are flushed from lanes
// the workers write directly, so the value is exact once the clients have
// their responses; it is polled briefly in case a worker's add lands just
// after the response bytes.
func checkRqTotal(t testing.TB, g *harness.Generation, listener string, want int64) {
	t.Helper()
	name := "listener." + listener + ".downstream_rq_total"
	deadline := time.Now().Add(2 * time.Second)
	for {
		doc := adminStats(t, g)
		got, found := doc.counter(name)
		if found && int64(got) == want {
			t.Logf("stats: %s = %d, as the clients counted", name, got)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("stats: %s = %d (found %v), the clients counted %d", name, got, found, want)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// steadyLoad is load that can stop gracefully: it runs loadgen in rounds of
// a fixed request count, back to back, so that stopping waits for the round
// in progress and no request is ever cancelled in flight. The totals are
// then exactly what the proxy served.
type steadyLoad struct {
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex // guards sum and cur
	sum  loadgen.Result
	cur  *loadgen.Run
	err  error
	runs int
}

// startSteadyLoad starts rounds of opts.Requests (default 500) requests.
func startSteadyLoad(t testing.TB, opts loadgen.Options) *steadyLoad {
	t.Helper()
	if opts.Requests == 0 {
		opts.Requests = 500
	}
	if opts.Duration == 0 {
		opts.Duration = 60 * time.Second
	}
	l := &steadyLoad{stop: make(chan struct{}), done: make(chan struct{})}
	l.sum.Mode = opts.Mode
	l.sum.Statuses = map[int]int64{}
	l.sum.Examples = map[loadgen.Class][]string{}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			r, err := loadgen.Start(context.Background(), opts)
			l.mu.Lock()
			l.cur, l.err = r, err
			l.mu.Unlock()
			if err != nil {
				return
			}
			res := r.Wait()
			l.mu.Lock()
			l.add(res)
			l.cur = nil
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { l.Stop() })
	return l
}

func (l *steadyLoad) add(r loadgen.Result) {
	l.runs++
	for i := range r.Counts {
		l.sum.Counts[i] += r.Counts[i]
	}
	l.sum.Retried += r.Retried
	l.sum.Conns += r.Conns
	l.sum.Elapsed += r.Elapsed
	for k, v := range r.Statuses {
		l.sum.Statuses[k] += v
	}
	for k, v := range r.Examples {
		if len(l.sum.Examples[k]) < 5 {
			l.sum.Examples[k] = append(l.sum.Examples[k], v...)
		}
	}
}

// Snapshot is the counts so far, the round in progress included.
func (l *steadyLoad) Snapshot() loadgen.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sum
	if l.cur != nil {
		c := l.cur.Snapshot()
		for i := range c.Counts {
			s.Counts[i] += c.Counts[i]
		}
		s.Retried += c.Retried
	}
	return s
}

// WaitMore waits until n more requests than now have finished, or fails.
func (l *steadyLoad) WaitMore(t testing.TB, n int64) {
	t.Helper()
	want := l.Snapshot().Total() + n
	deadline := time.Now().Add(20 * time.Second)
	for l.Snapshot().Total() < want {
		select {
		case <-l.done:
			t.Fatalf("load ended early: %v (err %v)", l.Snapshot(), l.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("load: fewer than %d more requests in 20s: %v", n, l.Snapshot())
		}
		time.Sleep(pollEvery)
	}
}

// Stop ends the load after the round in progress and returns the totals.
func (l *steadyLoad) Stop() loadgen.Result {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sum
}

// backendCheck accepts only the backend's own answer.
func backendCheck(id string) func(*http.Response, []byte) error {
	return func(_ *http.Response, body []byte) error {
		if string(body) != id+"\n" {
			return fmt.Errorf("body %q, want %q", body, id+"\n")
		}
		return nil
	}
}

// establishedOn counts the TCP connections process pid holds whose local
// port is port and whose state is ESTABLISHED, from /proc: a test can wait
// until a draining generation holds no client connection any more.
func establishedOn(pid, port int) (int, error) {
	inodes := map[string]bool{}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	n := 0
	for _, file := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "01" {
				continue
			}
			_, lport, _ := strings.Cut(fs[1], ":")
			p, err := strconv.ParseUint(lport, 16, 16)
			if err == nil && int(p) == port && inodes[fs[9]] {
				n++
			}
		}
		f.Close()
	}
	return n, nil
}

// portOf returns the port of "host:port".
func portOf(t testing.TB, addr string) int {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	p, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

// restartSockets lists the abstract restart sockets of base-id baseID
// that are bound right now (from /proc/net/unix).
func restartSockets(t testing.TB, baseID int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatalf("read /proc/net/unix: %v", err)
	}
	prefix := fmt.Sprintf("@hotproxy.%d.", baseID)
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) >= 8 && strings.HasPrefix(fs[7], prefix) && !seen[fs[7]] {
			seen[fs[7]] = true
			out = append(out, fs[7])
		}
	}
	return out
}
