package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// Issue 8, item 6: file-descriptor exhaustion. A listener's and the
// server's max_connections bound the client connections; past a bound a
// connection is accepted and closed at once and counted; the bound derived
// from the open-file limit keeps descriptors for the admin API; out of
// descriptors anyway, new connections are still closed at once, not left
// hanging in the queue.

// connLimitConfig is one http listener "web" answering 200 itself, with
// the given server-wide and per-listener max_connections.
func connLimitConfig(tb testing.TB, serverMax, listenerMax int) string {
	return fmt.Sprintf(`[server]
concurrency = %d
drain_time = "2s"
max_connections = %d

[admin]
address = %q

[hot_restart]
commit_window = "100ms"

[[listeners]]
name = "web"
address = %q
protocol = "http"
max_connections = %d

  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "ok" }
`, testConcurrency, serverMax, harness.FreeAddr(tb), harness.FreeAddr(tb), listenerMax)
}

// startConnLimited starts a proxy of connLimitConfig, under an open-file
// limit of nofile unless it is 0, and waits until it is ready. A start
// that lost a race for its free ports is retried once with new ones.
func startConnLimited(t *testing.T, serverMax, listenerMax, nofile int, args ...string) *harness.Proxy {
	t.Helper()
	for attempt := 1; ; attempt++ {
		cfg := connLimitConfig(t, serverMax, listenerMax)
		var p *harness.Proxy
		if nofile > 0 {
			p = harness.LaunchWithOpenFileLimit(t, cfg, nofile, args...)
		} else {
			p = harness.Launch(t, cfg, args...)
		}
		err := p.WaitReady(harness.DefaultReadyTimeout)
		if err == nil {
			return p
		}
		if attempt == 1 && p.Exited() && strings.Contains(strings.ToLower(p.Stderr()), "address already in use") {
			continue
		}
		t.Fatalf("hotproxy not ready: %v\n%s", err, p.Output())
	}
}

// closedWithin bounds how long a refused connection may take to be closed:
// "at once", with room for a loaded machine and the accept back-off (at
// most a second); a connection left in the queue hangs past it.
const closedWithin = 5 * time.Second

// holdConn dials addr and sends one keep-alive request. It returns the
// connection, still open, if it was served (200), or nil if the proxy
// closed it without an answer. A connection neither served nor closed
// within closedWithin fails the test.
func holdConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(closedWithin))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		return nil
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a connection to %s was neither served nor closed within %v: left hanging in the queue", addr, closedWithin)
	}
	if err != nil {
		return nil
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	c.SetDeadline(time.Time{})
	return c
}

// holdUntilRefused holds connections to addr until one is refused (or
// max are held) and returns the held ones.
func holdUntilRefused(t *testing.T, addr string, max int) []net.Conn {
	t.Helper()
	var held []net.Conn
	for range max {
		c := holdConn(t, addr)
		if c == nil {
			return held
		}
		held = append(held, c)
	}
	t.Fatalf("%d connections held and none refused", max)
	return nil
}

// TestConnLimitListener: with a listener's max_connections = N, of N+5
// clients holding their connections N are served, 5 are closed at once and
// counted in listener.web.downstream_cx_overflow; when some close, new ones
// are served again.
func TestConnLimitListener(t *testing.T) {
	t.Parallel()
	const n = 5
	p := startConnLimited(t, 0, n, 0)
	addr := p.Addr("web")
	var served []net.Conn
	closed := 0
	for range n + 5 {
		if c := holdConn(t, addr); c != nil {
			served = append(served, c)
		} else {
			closed++
		}
	}
	if len(served) != n || closed != 5 {
		t.Fatalf("of %d clients: %d served, %d closed; want %d served, 5 closed", n+5, len(served), closed, n)
	}
	waitStat(t, p, "listener.web.downstream_cx_overflow", 5, 10*time.Second)

	served[0].Close()
	served[1].Close()
	waitStat(t, p, "listener.web.downstream_cx_active", n-2, 10*time.Second)
	for i := range 2 {
		if holdConn(t, addr) == nil {
			t.Fatalf("new connection %d after two closed: refused, want served", i+1)
		}
	}
	if holdConn(t, addr) != nil {
		t.Fatal("a connection over the bound again was served")
	}
	waitStat(t, p, "listener.web.downstream_cx_overflow", 6, 10*time.Second)
}

// lowFileLimit is the open-file limit the proxies of the fd tests run
// with. With server.max_connections = 0 the bound derived from it is
// (128 - 64) / 2 = 32 (workers.derivedMaxConnections).
const (
	lowFileLimit    = 128
	derivedAt128    = 32
	maxWarningLines = 3
)

// TestConnLimitOpenFileLimit: a proxy whose open-file limit is low and
// whose server.max_connections is 0 serves connections up to the bound
// derived from that limit and closes the rest at once; its admin API keeps
// answering; the warning is logged a few times at most, and no accept ever
// fails for want of descriptors. At the bound it still hands over to a new
// generation (the restart socket and the passed fds come from the reserve).
func TestConnLimitOpenFileLimit(t *testing.T) {
	t.Parallel()
	baseID := newBaseID()
	p := startConnLimited(t, 0, 0, lowFileLimit, "--base-id", strconv.Itoa(baseID))
	addr := p.Addr("web")
	held := holdUntilRefused(t, addr, 4*lowFileLimit)
	if len(held) != derivedAt128 {
		t.Fatalf("%d connections served before the first refusal, want %d (derived from the open-file limit %d)", len(held), derivedAt128, lowFileLimit)
	}
	const more = 40
	for range more {
		if holdConn(t, addr) != nil {
			t.Fatal("a connection over the derived bound was served")
		}
	}

	// The admin API answers, many times over: the reserve is real.
	for range 20 {
		if code, body := p.AdminGet("/ready"); code != http.StatusOK {
			t.Fatalf("/ready at the connection bound: %d %s", code, body)
		}
	}
	v := waitStat(t, p, "listener.web.downstream_cx_overflow", 1+more, 10*time.Second)
	if got := v["listener.web.downstream_cx_active"]; got != derivedAt128 {
		t.Errorf("downstream_cx_active %d, want %d", got, derivedAt128)
	}

	logs := p.Stderr()
	if n := strings.Count(logs, "connection limit reached"); n < 1 || n > maxWarningLines {
		t.Errorf("%d \"connection limit reached\" warnings for %d refusals, want 1 to %d:\n%s", n, 1+more, maxWarningLines, logs)
	}
	for _, s := range []string{"out of file descriptors", "accept failed", "too many open files"} {
		if strings.Contains(logs, s) {
			t.Errorf("the log says %q: the derived bound did not keep a reserve:\n%s", s, logs)
		}
	}

	// Those held leave: new ones are served.
	for _, c := range held[:3] {
		c.Close()
	}
	waitStat(t, p, "listener.web.downstream_cx_active", derivedAt128-3, 10*time.Second)
	for i := range 3 {
		if holdConn(t, addr) == nil {
			t.Fatalf("new connection %d after three closed: refused, want served", i+1)
		}
	}

	// Back at the bound, a new generation takes over; the old one drains
	// its idle connections and exits 0.
	if holdConn(t, addr) != nil {
		t.Fatal("a connection over the bound was served")
	}
	g1 := harness.StartGeneration(t, p.ConfigPath, baseID, 1, harness.LaunchOptions{})
	if err := g1.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("hand-over at the connection bound: %v\n%s", err, g1.Output())
	}
	if code, err := p.Wait(30 * time.Second); err != nil || code != 0 {
		t.Fatalf("epoch 0 after the hand-over: exit %d, %v", code, err)
	}
	if holdConn(t, addr) == nil {
		t.Fatal("epoch 1 did not serve a new connection")
	}
}

// TestConnLimitOutOfDescriptors: server.max_connections set beyond what
// the open-file limit allows, so that accepts do run out of descriptors.
// New connections are then still closed at once (the spare descriptor),
// not left hanging in the queue; the accept loops do not spin; the warning
// is throttled; once connections close the proxy (admin included) works
// again and the refusals were counted.
func TestConnLimitOutOfDescriptors(t *testing.T) {
	t.Parallel()
	p := startConnLimited(t, 1000, 0, lowFileLimit)
	if !strings.Contains(p.Stderr(), "exceeds what the open-file limit allows") {
		t.Errorf("no warning at start that server.max_connections = 1000 does not fit an open-file limit of %d:\n%s", lowFileLimit, p.Stderr())
	}
	addr := p.Addr("web")
	held := holdUntilRefused(t, addr, 4*lowFileLimit)
	if len(held) <= derivedAt128 || len(held) >= lowFileLimit {
		t.Fatalf("%d connections served before the first refusal: want more than the derived %d (the bound is 1000) and fewer than the limit %d", len(held), derivedAt128, lowFileLimit)
	}
	t.Logf("%d connections served out of an open-file limit of %d", len(held), lowFileLimit)
	const more = 20
	for range more {
		if holdConn(t, addr) != nil {
			t.Fatal("a connection was served with no descriptor left")
		}
	}

	// Idle at the limit, the accept loops back off instead of spinning.
	before, err := cpuTime(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	after, err := cpuTime(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	if used := after - before; used > 200*time.Millisecond {
		t.Errorf("%v of CPU in one idle second out of descriptors: the accept loops spin", used)
	}

	if n := strings.Count(p.Stderr(), "out of file descriptors"); n < 1 || n > maxWarningLines {
		t.Errorf("%d \"out of file descriptors\" warnings, want 1 to %d:\n%s", n, maxWarningLines, p.Stderr())
	}

	for _, c := range held {
		c.Close()
	}
	if err := p.WaitReady(10 * time.Second); err != nil {
		t.Fatalf("admin after the connections closed: %v", err)
	}
	// The proxy sees the closes as it gets to them (on a busy machine,
	// after the admin answers): wait until it has closed its side of all.
	v := waitStat(t, p, "listener.web.downstream_cx_active", 0, 10*time.Second)
	if got := v["listener.web.downstream_cx_overflow"]; got != 1+more {
		t.Errorf("downstream_cx_overflow %d, want %d", got, 1+more)
	}
	if holdConn(t, addr) == nil {
		t.Error("not served after the connections closed")
	}
}

// cpuTime is the user plus system CPU time process pid has used, from
// /proc/PID/stat (utime and stime, in USER_HZ ticks, 100 per second on
// Linux).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from the ")".
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format %q", pid, b)
	}
	var ticks int64
	for _, s := range f[11:13] { // fields 14 and 15 of the line
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100), nil
}
