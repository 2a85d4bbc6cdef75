package workers

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/exchange"
)

// TestOverloadRefuseAndKeepAlive: refuse_requests answers 503 with
// Retry-After and closes; disable_keepalive closes after a normal
// response; clearing the state serves as before on the same listener.
func TestOverloadRefuseAndKeepAlive(t *testing.T) {
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 2)
	a := addr(t, m, "web")
	c := newClient(t)

	m.SetOverload(OverloadState{RefuseRequests: true, RetryAfter: 2500 * time.Millisecond})
	resp, body := get(t, c, "http://"+a+"/x")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" || !resp.Close || !strings.Contains(body, "overloaded") {
		t.Fatalf("refusing: got %d Retry-After %q close %v body %q; want 503, Retry-After 3, Connection: close", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, body)
	}
	// A request with a body is refused too, and the client reads the 503.
	raw := rawRequest(t, a, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
	if raw.StatusCode != 503 {
		t.Fatalf("refusing a POST: got %d, want 503", raw.StatusCode)
	}
	if got := counter(m, "overload.refuse_requests.refused"); got != 2 {
		t.Errorf("overload.refuse_requests.refused = %d, want 2", got)
	}
	if got := counter(m, "overload.shed_total"); got != 2 {
		t.Errorf("overload.shed_total = %d, want 2", got)
	}

	m.SetOverload(OverloadState{DisableKeepAlive: true})
	resp, body = get(t, c, "http://"+a+"/x")
	if resp.StatusCode != 200 || !resp.Close || !strings.Contains(body, "Path: /x") {
		t.Fatalf("keep-alive off: got %d close %v body %q; want 200 with Connection: close", resp.StatusCode, resp.Close, body)
	}

	m.SetOverload(OverloadState{})
	for range 2 {
		resp, _ = get(t, c, "http://"+a+"/x")
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("overload cleared: got %d close %v; want 200 kept alive", resp.StatusCode, resp.Close)
		}
	}
}

// TestOverloadStopAccepting: without the steering program (balance =
// "kernel"), new connections are closed at accept and counted; a
// connection accepted before goes on being served. With the program,
// overload_linux_test.go.
func TestOverloadStopAccepting(t *testing.T) {
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL), func(l *config.Listener) { l.Balance = config.BalanceKernel }), 1)
	a := addr(t, m, "web")
	if got := m.StopAcceptingModes()["web"]; got != StopAcceptingAccept {
		t.Fatalf("StopAcceptingModes()[web] = %q without a program, want %q", got, StopAcceptingAccept)
	}
	c := newClient(t)
	if resp, _ := get(t, c, "http://"+a+"/before"); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	m.SetOverload(OverloadState{StopAccepting: true})
	nc, err := net.DialTimeout("tcp", a, 5*time.Second)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		// Reset so fast that connect(2) saw it: closed, as it should be.
	case err != nil:
		t.Fatal(err)
	default:
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(nc, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
		if n, err := nc.Read(make([]byte, 1)); err == nil || n > 0 {
			t.Fatalf("a new connection was served while not accepting (read %d, %v)", n, err)
		} else if exchange.IsTimeout(err) {
			t.Fatal("a new connection was left open while not accepting")
		}
	}
	waitFor(t, 5*time.Second, "overload.stop_accepting.closed = 1", func() bool {
		return counter(m, "overload.stop_accepting.closed") == 1
	})
	m.CountKernelRefusals()
	if got := counter(m, "overload.stop_accepting.refused"); got != 0 {
		t.Errorf("overload.stop_accepting.refused = %d without a program, want 0", got)
	}
	if resp, _ := get(t, c, "http://"+a+"/kept"); resp.StatusCode != 200 {
		t.Fatalf("the connection accepted before: %d, want 200", resp.StatusCode)
	}
	m.SetOverload(OverloadState{})
	if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: h\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("accepting again: %d", resp.StatusCode)
	}
}

// TestOverloadResetBiggest: the connection holding buffers the longest
// (a slow upload) is reset; one that is idle between requests (waiting
// in its goroutine, or parked), and one whose buffers are newer than the
// bound, are not.
func TestOverloadResetBiggest(t *testing.T) {
	t.Run("idle in its goroutine", func(t *testing.T) { testOverloadResetBiggest(t, false) })
	t.Run("idle parked", func(t *testing.T) { testOverloadResetBiggest(t, true) })
}

func testOverloadResetBiggest(t *testing.T, parked bool) {
	be := echoBackend(t)
	m := startManagerParkingAfter(t, proxyConfig(hostOf(be.URL), func(l *config.Listener) { l.ParkIdleConnections = new(parked) }), 2, 20*time.Millisecond)
	a := addr(t, m, "web")
	c := newClient(t)
	if resp, _ := get(t, c, "http://"+a+"/idle"); resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	// The client has its response before the proxy's side of the
	// connection lets go of its buffers: until it is idle it counts as
	// holding them, and the wait for the upload below would be met by it.
	waitFor(t, 5*time.Second, "the keep-alive connection to be idle", func() bool { return m.idleConns() == 1 && m.heldConns() == 0 })
	if parked {
		waitFor(t, 5*time.Second, "the keep-alive connection to park", func() bool { return parkedConns(m) == 1 })
	}
	slowUpload := func() net.Conn {
		nc, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		io.WriteString(nc, "POST /echo-body HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n\r\npartial")
		return nc
	}
	old := slowUpload()
	waitFor(t, 5*time.Second, "the upload's connection to hold its buffers", func() bool { return m.heldConns() == 1 })
	for range 3 {
		m.AdvanceOverloadPass()
	}
	young := slowUpload()
	waitFor(t, 5*time.Second, "the second upload's connection to hold its buffers", func() bool { return m.heldConns() == 2 })
	if n := m.ResetBiggest(5, 2); n != 1 {
		t.Fatalf("ResetBiggest reset %d connections, want 1 (the upload held 3 passes, the other 0)", n)
	}
	old.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadAll(bufio.NewReader(old))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the old upload read %v, want a reset", err)
	}
	young.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := young.Read(make([]byte, 1)); !exchange.IsTimeout(err) {
		t.Errorf("the young upload was cut (%v), want it still open", err)
	}
	if resp, _ := get(t, c, "http://"+a+"/still"); resp.StatusCode != 200 {
		t.Errorf("the idle keep-alive connection: %d, want 200", resp.StatusCode)
	}
	if got := counter(m, "overload.reset_connections.reset"); got != 1 {
		t.Errorf("overload.reset_connections.reset = %d, want 1", got)
	}
}

// TestOverloadShrinkTimeouts: with the timeouts shrunk, a new
// connection's header timeout is the shrunk one, and idle connections past
// the shrunk idle timeout are closed.
func TestOverloadShrinkTimeouts(t *testing.T) {
	be := echoBackend(t)
	m := startManager(t, proxyConfig(hostOf(be.URL), func(l *config.Listener) {
		l.HeaderTimeout = dur(20 * time.Second)
		l.IdleTimeout = dur(20 * time.Second)
	}), 1)
	a := addr(t, m, "web")
	m.SetOverload(OverloadState{TimeoutPercent: 2}) // 20s → 400ms
	nc, err := net.DialTimeout("tcp", a, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	start := time.Now()
	io.WriteString(nc, "GET / HTTP/1.1\r\n")
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != 408 {
		t.Fatalf("an incomplete head under shrunk timeouts: %v %v, want 408", resp, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("408 after %v, want the shrunk header timeout (400ms), not 20s", d)
	}

	m.SetOverload(OverloadState{})
	c := newClient(t)
	if resp, _ := get(t, c, "http://"+a+"/x"); resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	waitFor(t, 5*time.Second, "the connection to be idle", func() bool { return m.idleConns() == 1 })
	if n := m.CloseIdleShrunk(100); n != 0 {
		t.Errorf("CloseIdleShrunk(100) closed %d connections idle for less than idle_timeout", n)
	}
	if n := m.CloseIdleShrunk(0); n != 1 {
		t.Errorf("CloseIdleShrunk(0) closed %d idle connections, want 1", n)
	}
}

func (m *Manager) heldConns() int {
	n := 0
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			if cc, ok := c.(*httpfront.Conn); ok {
				if since, _, _, idle := cc.HeldBuffers(); since != 0 && !idle {
					n++
				}
			}
		}
		wk.conns.mu.Unlock()
	}
	return n
}

func (m *Manager) idleConns() int {
	n := 0
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			if cc, ok := c.(*httpfront.Conn); ok && cc.Idle() {
				n++
			}
		}
		wk.conns.mu.Unlock()
	}
	return n
}
