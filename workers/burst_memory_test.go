package workers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// burstMemoryBudget is what a connection may still cost, in resident
// memory, six seconds after a burst, measured in this test's process.
// Issue 22's bar is 8 KiB, for the hotproxy binary with GOMAXPROCS=1
// (scripts/bench-peers.sh burst: 7.2 KiB); here the test binary with two
// Ps adds its own (GC metadata sized by the burst's peak, a pool cache per
// P), so the budget is 12 KiB: about 10 are measured, and the code before
// the reclaimer and the small buffers left 43.
const burstMemoryBudget = 12 << 10

// A burst of simultaneous first requests, every one in the proxy's hands
// at once (the backend answers none before all have arrived), then idle:
// within 6 s the proxy's process is back to at most burstMemoryBudget of
// RSS per connection. The clients run in another process (this test
// binary, run again) so that only the proxy's side, and the backend's,
// which it closes, is counted.
func TestBurstMemoryGivenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a client process and 1,000 connections")
	}
	const n = 1000
	var arrived atomic.Int64
	allIn := make(chan struct{})
	var once sync.Once
	backend := rawBackend(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		if arrived.Add(1) == n {
			once.Do(func() { close(allIn) })
		}
		select {
		case <-allIn:
		case <-time.After(30 * time.Second):
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	})
	m := startManager(t, proxyConfig(backend, func(l *config.Listener) { l.IdleTimeout = dur(2 * time.Minute) }), 1)
	runtime.GC()
	debug.FreeOSMemory()
	before := processRSS(t)

	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d burst", idleClientEnv, addr(t, m, "web"), n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close() // the client's cue to exit
		cmd.Wait()
	}()
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("client process: %q", line)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the client process did not get ready in 90s")
	}
	if got := arrived.Load(); got != n {
		t.Fatalf("the backend saw %d requests, want %d", got, n)
	}
	waitFor(t, 10*time.Second, "every connection to be idle", func() bool { return idleConns(m) == n })
	// Every buffer and state is given back: what the reclaimer watches.
	waitFor(t, 5*time.Second, "the workers to hold no buffer", func() bool { return m.workers[0].front.Bufs.Held() == 0 })
	if raceEnabled {
		t.Log("-race: its shadow memory swamps RSS; the budget is checked without it (and in integration's TestBurstMemoryGivenBack)")
		return
	}
	idleAt := time.Now()
	var perConn float64
	for deadline := idleAt.Add(6 * time.Second); ; {
		perConn = float64(processRSS(t)-before) / n
		if perConn <= burstMemoryBudget || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d connections after a burst: %.1f KiB of RSS per connection %.1f s after they went idle",
		n, perConn/1024, time.Since(idleAt).Seconds())
	if perConn > burstMemoryBudget {
		t.Fatalf("6 s after a burst the proxy still holds %.1f KiB of RSS per idle connection, want at most %d KiB (what do the pools or the heap keep? see reclaim.go)",
			perConn/1024, burstMemoryBudget>>10)
	}
	if got := idleConns(m); got != n {
		t.Fatalf("%d idle connections at the end, want %d: a closed connection would flatter the figure", got, n)
	}
}

// processRSS is this process's VmRSS in bytes.
func processRSS(tb testing.TB) int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skipf("no /proc/self/status (%v): RSS is measured on Linux only", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				tb.Fatalf("/proc/self/status: %q: %v", line, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("/proc/self/status: no VmRSS line")
	return 0
}
