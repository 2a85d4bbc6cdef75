package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/shm"
)

// TestStatsCLI runs `hotproxy stats` against the region of a real proxy:
// the value it reads is the number of requests sent, in every format,
// with the owner table, while the proxy is stopped (SIGSTOP), and in
// --watch with rates; files that are not a region are refused, untouched.
func TestStatsCLI(t *testing.T) {
	t.Parallel()
	b := harness.StartHTTPBackend(t, "b1")
	p := harness.Start(t, httpProxyConfig(b.Addr))
	region := harness.StatsPath(t)

	const n = 40
	sendRequests(t, p, n)
	waitCLICounter(t, region, "listener.web.downstream_rq_total", n, 5*time.Second)

	t.Run("json", func(t *testing.T) {
		res := statsCLI(t, 0, "--path", region, "--filter", "downstream_rq_total", "--format", "json")
		doc := decodeCLIJSON(t, res)
		if len(doc.Stats) != 1 || doc.Stats[0].Name != "listener.web.downstream_rq_total" {
			t.Fatalf("--filter downstream_rq_total selected %+v, want only listener.web.downstream_rq_total", doc.Stats)
		}
		if v := doc.Stats[0].Counter; v == nil || *v != n {
			t.Errorf("listener.web.downstream_rq_total = %v, want %d", doc.Stats[0].Counter, n)
		}
		if doc.Path != region {
			t.Errorf("path %q, want %q", doc.Path, region)
		}
	})

	t.Run("text", func(t *testing.T) {
		res := statsCLI(t, 0, "--path", region, "--filter", `^listener\.web\.downstream_rq_total$`)
		if got, want := res.Stdout, fmt.Sprintf("listener.web.downstream_rq_total: %d\n", n); got != want {
			t.Errorf("text output %q, want %q", got, want)
		}
		// --usedonly drops the zero counters.
		res = statsCLI(t, 0, "--path", region, "--usedonly", "--filter", `listener\.web\.downstream_rq_`)
		wantContains(t, "--usedonly output", res.Stdout, "downstream_rq_2xx: ")
		if strings.Contains(res.Stdout, "downstream_rq_5xx") {
			t.Errorf("--usedonly shows a zero counter:\n%s", res.Stdout)
		}
	})

	t.Run("config", func(t *testing.T) {
		// -c finds the region through the config's [stats] path.
		res := statsCLI(t, 0, "-c", p.ConfigPath, "--filter", `^listener\.web\.downstream_rq_total$`)
		wantContains(t, "-c output", res.Stdout, fmt.Sprintf("listener.web.downstream_rq_total: %d\n", n))
	})

	t.Run("prometheus", func(t *testing.T) {
		res := statsCLI(t, 0, "--path", region, "--filter", "downstream_rq_total", "--format", "prometheus")
		wantContains(t, "prometheus output", res.Stdout,
			"# TYPE hotproxy_listener_downstream_rq_total counter\n",
			fmt.Sprintf("hotproxy_listener_downstream_rq_total{listener=\"web\"} %d\n", n))
	})

	t.Run("owners", func(t *testing.T) {
		res := statsCLI(t, 0, "--path", region, "--owners", "--filter", "downstream_rq_total")
		lines := strings.Split(res.Stdout, "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[0], "SLOT") {
			t.Fatalf("--owners: no owner table first:\n%s", res.Stdout)
		}
		found := false
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) >= 7 && f[1] == strconv.Itoa(p.PID()) {
				found = true
				if f[3] != "live" || f[2] != "0" {
					t.Errorf("owner line %q: want epoch 0, live", l)
				}
			}
		}
		if !found {
			t.Errorf("--owners does not list the proxy's pid %d:\n%s", p.PID(), res.Stdout)
		}
	})

	t.Run("watch", func(t *testing.T) {
		testStatsCLIWatch(t, p, region)
	})

	t.Run("wedged", func(t *testing.T) {
		// The count now includes the watch test's requests.
		want := cliCounter(t, region, "listener.web.downstream_rq_total")
		pid := p.PID()
		t.Cleanup(func() {
			if !p.Exited() {
				_ = syscall.Kill(pid, syscall.SIGCONT) // only the proxy this test started
			}
		})
		p.Signal(syscall.SIGSTOP)
		waitProcState(t, pid, 'T', 5*time.Second)

		start := time.Now()
		if got := cliCounter(t, region, "listener.web.downstream_rq_total"); got != want {
			t.Errorf("with the proxy stopped: listener.web.downstream_rq_total = %d, want %d", got, want)
		}
		res := statsCLI(t, 0, "--path", region, "--owners", "--format", "prometheus", "--filter", "downstream_rq_total")
		wantContains(t, "prometheus output of a stopped proxy", res.Stdout,
			fmt.Sprintf("pid=%d ", pid), fmt.Sprintf("hotproxy_listener_downstream_rq_total{listener=\"web\"} %d\n", want))
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("hotproxy stats took %v against a stopped proxy", d)
		}

		p.Signal(syscall.SIGCONT)
		if err := p.WaitReady(harness.DefaultReadyTimeout); err != nil {
			t.Fatalf("after SIGCONT: %v", err)
		}
	})

	t.Run("garbage", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "garbage.stats")
		junk := bytes.Repeat([]byte("this is not a hotproxy stats region\n"), 200)
		if err := os.WriteFile(path, junk, 0o640); err != nil {
			t.Fatal(err)
		}
		res := statsCLI(t, 1, "--path", path)
		wantContains(t, "stderr", res.Stderr, path, "not a valid hotproxy stats region")
		if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, junk) {
			t.Errorf("the garbage file was changed (%v)", err)
		}
		// A region cut short: refused too, never a crash.
		head := make([]byte, shm.HeaderSize+100)
		f, err := os.Open(region)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadFull(f, head)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		short := filepath.Join(t.TempDir(), "short.stats")
		if err := os.WriteFile(short, head, 0o640); err != nil {
			t.Fatal(err)
		}
		res = statsCLI(t, 1, "--path", short)
		wantContains(t, "stderr", res.Stderr, short, "truncated")
	})

	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing.stats")
		res := statsCLI(t, 1, "--path", path)
		wantContains(t, "stderr", res.Stderr, path+": no such file (", "--path")

		id := harness.UniqueBaseID()
		def := shm.DefaultPath(uint64(id))
		if _, err := os.Stat(def); err == nil {
			t.Skipf("%s exists", def)
		}
		res = statsCLI(t, 1, "--base-id", strconv.Itoa(id))
		want := fmt.Sprintf("hotproxy stats: %s: no such file (is hotproxy running with base-id %d? use --base-id or --path)\n", def, id)
		if res.Stderr != want {
			t.Errorf("stderr %q, want %q", res.Stderr, want)
		}
	})

	t.Run("bad regex", func(t *testing.T) {
		res := statsCLI(t, 2, "--path", region, "--filter", "rq_(total")
		wantContains(t, "stderr", res.Stderr, `--filter "rq_(total"`)
	})
}

// testStatsCLIWatch runs `hotproxy stats --watch 100ms`, reads its first
// block (no rates), sends requests, and reads blocks until one shows a
// positive request rate; then stops it with SIGTERM, which exits 0.
func testStatsCLIWatch(t *testing.T, p *harness.Proxy, region string) {
	cmd := exec.Command(harness.Binary(t), "stats", "--path", region, "--watch", "100ms", "--filter", `^listener\.web\.downstream_rq_total$`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	cmd.Stderr = errFile
	stderr := func() string { b, _ := os.ReadFile(errFile.Name()); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	blocks := make(chan []string, 64)
	go func() {
		// Blocks are "--- header ---", lines, then an empty line.
		sc := bufio.NewScanner(out)
		var cur []string
		for sc.Scan() {
			if sc.Text() == "" {
				blocks <- cur
				cur = nil
				continue
			}
			cur = append(cur, sc.Text())
		}
		close(blocks)
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill() // only the watcher this test started
			for range blocks {
			}
			<-exited
		}
	})

	next := func() []string {
		t.Helper()
		select {
		case bl, ok := <-blocks:
			if !ok {
				t.Fatalf("hotproxy stats --watch ended early: %s", stderr())
			}
			return bl
		case <-time.After(5 * time.Second):
			t.Fatalf("no --watch block within 5s; stderr: %s", stderr())
		}
		return nil
	}
	header := regexp.MustCompile(`^--- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\S* ` + regexp.QuoteMeta(region) + ` (\(rates over the last \S+\) )?---$`)
	first := next()
	if len(first) != 2 || !header.MatchString(first[0]) || !strings.HasPrefix(first[1], "listener.web.downstream_rq_total: ") || strings.Contains(first[1], "/s") {
		t.Fatalf("first block: want a header and the value without a rate, got %q", first)
	}
	line := regexp.MustCompile(`^listener\.web\.downstream_rq_total: +(\d+) +\+(\d+\.\d)/s$`)
	second := next()
	if len(second) != 2 || !header.MatchString(second[0]) || !strings.Contains(second[0], "rates over the last") || !line.MatchString(second[1]) {
		t.Fatalf("second block: want a header with the interval and the value with its rate, got %q", second)
	}

	sendRequests(t, p, 20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		bl := next()
		if m := line.FindStringSubmatch(bl[len(bl)-1]); m != nil && m[2] != "0.0" {
			t.Logf("--watch block with a rate: %q", bl)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no positive rate in --watch within 10s; last block %q", bl)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("hotproxy stats --watch after SIGTERM: %v (want exit 0); stderr: %s", waitErr, stderr())
		}
	case <-time.After(5 * time.Second):
		t.Errorf("hotproxy stats --watch did not exit within 5s of SIGTERM")
	}
}

// statsCLI runs `hotproxy stats ARGS...` and fails the test unless it
// exits with code.
func statsCLI(t *testing.T, code int, args ...string) harness.RunResult {
	t.Helper()
	res := harness.Run(t, append([]string{"stats"}, args...)...)
	if res.Code != code {
		t.Fatalf("hotproxy stats %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.Code, code, res.Stdout, res.Stderr)
	}
	return res
}

// cliStatsDoc is the part of `hotproxy stats --format json` the tests read.
type cliStatsDoc struct {
	Path   string `json:"path"`
	Owners []struct {
		PID int `json:"pid"`
	} `json:"owners"`
	Stats []struct {
		Name    string  `json:"name"`
		Counter *uint64 `json:"counter"`
	} `json:"stats"`
}

func decodeCLIJSON(t *testing.T, res harness.RunResult) cliStatsDoc {
	t.Helper()
	var doc cliStatsDoc
	if err := json.Unmarshal([]byte(res.Stdout), &doc); err != nil {
		t.Fatalf("hotproxy stats --format json: %v\n%s", err, res.Stdout)
	}
	return doc
}

// cliCounter reads one counter with `hotproxy stats --format json`.
func cliCounter(t *testing.T, region, name string) uint64 {
	t.Helper()
	res := statsCLI(t, 0, "--path", region, "--format", "json", "--filter", "^"+regexp.QuoteMeta(name)+"$")
	doc := decodeCLIJSON(t, res)
	if len(doc.Stats) != 1 || doc.Stats[0].Counter == nil {
		t.Fatalf("no counter %s in %s", name, res.Stdout)
	}
	return *doc.Stats[0].Counter
}

// waitCLICounter polls the counter through the CLI until it is want: a
// worker's add may land just after the client has its response.
func waitCLICounter(t *testing.T, region, name string, want uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := cliCounter(t, region, name)
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", name, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendRequests sends n GETs one after the other through p's listener
// "web", each on a new connection (so no client retry can count twice),
// and fails the test unless each is answered 200.
func sendRequests(t *testing.T, p *harness.Proxy, n int) {
	t.Helper()
	c := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
	}
	defer c.CloseIdleConnections()
	for i := 0; i < n; i++ {
		resp, _ := get(t, c, p.URL("web", "/"))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
}

// waitProcState waits until /proc/PID/stat shows the state letter want
// ('T': stopped).
func waitProcState(t *testing.T, pid int, want byte, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		// "pid (comm) S ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) && data[i+2] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: state not %c within %v: %s", pid, want, timeout, data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
