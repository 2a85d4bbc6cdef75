package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// Issue 22's bar: a burst of simultaneous first requests, every one in
// the proxy's hands at once (the backend answers none before all have
// arrived), then idle: 6 s later the hotproxy process holds at most 8 KiB
// of RSS per connection more than before the burst. Before the small read
// buffers and the reclaimer (workers/reclaim.go) it held about 31 KiB
// (scripts/bench-peers.sh burst).
func TestBurstMemoryGivenBack(t *testing.T) {
	const (
		n      = 2000
		budget = 8 << 10
	)
	var arrived atomic.Int64
	allIn := make(chan struct{})
	var once sync.Once
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if arrived.Add(1) == n {
					once.Do(func() { close(allIn) })
				}
				select {
				case <-allIn:
				case <-time.After(60 * time.Second):
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	cfg := httpProxyConfig(ln.Addr().String())
	cfg.Listeners[0].IdleTimeout = "2m"
	p := harness.StartProxy(t, cfg.Allocate(t).TOML())
	addr := p.Addr("web")
	before := rssOf(t, p.PID())

	conns := make([]net.Conn, n)
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, n, err)
		}
		conns[i] = c
	}
	for i, c := range conns { // every request before any response is read
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: burst\r\n\r\n"); err != nil {
			t.Fatalf("request %d of %d: %v", i+1, n, err)
		}
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(90 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d of %d: %v", i+1, n, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close || br.Buffered() > 0 {
			t.Fatalf("response %d of %d: %s (close %v, %d bytes after it), want a keep-alive 200", i+1, n, resp.Status, resp.Close, br.Buffered())
		}
		c.SetReadDeadline(time.Time{})
	}
	if got := arrived.Load(); got != n {
		t.Fatalf("the backend saw %d requests, want %d", got, n)
	}
	idleAt := time.Now()
	var perConn float64
	for deadline := idleAt.Add(6 * time.Second); ; {
		perConn = float64(rssOf(t, p.PID())-before) / n
		if perConn <= budget || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d connections after a burst: %.1f KiB of hotproxy's RSS per connection %.1f s after they went idle",
		n, perConn/1024, time.Since(idleAt).Seconds())
	if perConn > budget {
		t.Fatalf("6 s after a burst hotproxy still holds %.1f KiB of RSS per idle connection, want at most %d KiB (see workers/reclaim.go)",
			perConn/1024, budget>>10)
	}
	// Still open, all of them: a connection the proxy dropped would
	// flatter the figure.
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); !os.IsTimeout(err) {
			t.Fatalf("connection %d of %d: %v, want it open and silent", i+1, n, err)
		}
	}
}

// rssOf is a process's VmRSS in bytes.
func rssOf(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("reading hotproxy's memory: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			if err != nil {
				tb.Fatalf("/proc/%d/status: %q: %v", pid, line, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("/proc/%d/status: no VmRSS line", pid)
	return 0
}
