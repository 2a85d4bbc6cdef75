//go:build linux

package workers

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/internal/rawsock"

	"github.com/hotproxy/hotproxy/config"
)

// listenNoDelay listens on loopback, with TCP_NODELAY set on the listening
// socket itself when noDelay.
func listenNoDelay(tb testing.TB, noDelay bool) *net.TCPListener {
	tb.Helper()
	lc := net.ListenConfig{KeepAlive: noKeepAlive}
	if noDelay {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// rawAccept accepts one connection with accept4(2) on the listening
// socket, bypassing net (which would set TCP_NODELAY on it), waiting in
// Go's poller. A net.TCPListener's RawConn cannot wait (its Read is
// EINVAL), so the socket is a dup in an os.File (listenerFile), whose
// RawConn can. The caller closes the fd.
func rawAccept(tb testing.TB, lf *os.File) int {
	tb.Helper()
	raw, err := lf.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	nfd := -1
	var aerr error
	err = raw.Read(func(fd uintptr) bool {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return aerr != unix.EAGAIN && aerr != unix.EINTR
	})
	if err != nil || aerr != nil {
		tb.Fatalf("accept4: poller %v, accept4 %v", err, aerr)
	}
	return nfd
}

// listenerFile is l's socket as a non-blocking os.File, with a deadline.
func listenerFile(tb testing.TB, l *net.TCPListener) *os.File {
	tb.Helper()
	raw, err := l.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	nfd := -1
	var derr error
	raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	if derr != nil {
		tb.Fatal(derr)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(nfd), "listener")
	tb.Cleanup(func() { f.Close() })
	f.SetDeadline(time.Now().Add(time.Minute))
	return f
}

// TestListenerNoDelayInherited checks what a once-per-listener
// TCP_NODELAY would rely on: Linux copies the option from the listening
// socket to each socket accept returns, so that an accept path that
// bypasses net's per-connection setsockopt still sends small responses
// without Nagle's delay. The control (no option on the listener) shows
// the read sees the difference.
func TestListenerNoDelayInherited(t *testing.T) {
	for _, tc := range []struct {
		name     string
		listener bool
		want     int
	}{
		{"set on the listener", true, 1},
		{"not set", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := acceptedTCPOption(t, listenNoDelay(t, tc.listener), unix.TCP_NODELAY)
			if (got != 0) != (tc.want != 0) {
				t.Errorf("TCP_NODELAY on the accepted socket: %d, want %d", got, tc.want)
			}
		})
	}
}

// TestListenerDelayedACKInherited: TCP_QUICKACK cleared on a listening
// socket is inherited by the sockets it accepts (the kernel copies the
// listener's delayed-ACK mode into the child), which setDelayedFirstACK
// relies on; a control without it accepts sockets in quick-ACK mode.
func TestListenerDelayedACKInherited(t *testing.T) {
	for _, set := range []bool{true, false} {
		t.Run(fmt.Sprint("cleared on the listener: ", set), func(t *testing.T) {
			l := listenPlainTCP(t)
			if set {
				if err := setDelayedFirstACK(l); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := acceptedTCPOption(t, l, unix.TCP_QUICKACK), b2i(!set); got != want {
				t.Errorf("TCP_QUICKACK on the accepted socket: %d, want %d", got, want)
			}
		})
	}
}

// listenPlainTCP listens on 127.0.0.1:0 without MPTCP (Go's default where
// the kernel has it), as a listener with the steering program does.
func listenPlainTCP(tb testing.TB) *net.TCPListener {
	tb.Helper()
	lc := net.ListenConfig{KeepAlive: noKeepAlive}
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// acceptedTCPOption connects to l, accepts the connection with a raw
// accept4 (net would set TCP_NODELAY itself) and returns the accepted
// socket's IPPROTO_TCP option opt.
func acceptedTCPOption(t *testing.T, l *net.TCPListener, opt int) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fd := rawAccept(t, listenerFile(t, l))
	defer unix.Close(fd)
	got, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, opt)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BenchmarkAcceptNet and BenchmarkAcceptRaw compare what a connection
// costs the accepting side through net (accept4, epoll_ctl ADD,
// getsockname, setsockopt TCP_NODELAY; epoll_ctl DEL and close) with the
// HTTP listeners' raw accept (rawsock: accept4, and close; a connection
// that never waits never joins the poller): the dial and the client's
// close are the same in both, so the difference is the accept path's
// (issue 22).
func BenchmarkAcceptNet(b *testing.B) {
	l := listenNoDelay(b, true)
	benchAccept(b, l, func() {
		c, err := l.AcceptTCP()
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	})
}

func BenchmarkAcceptRaw(b *testing.B) {
	l := listenNoDelay(b, true)
	rl, err := rawsock.Listen(l)
	if err != nil {
		b.Fatal(err)
	}
	defer rl.Close()
	rl.SetDeadline(time.Now().Add(time.Minute))
	a := rl.NewAcceptor()
	benchAccept(b, l, func() {
		c, err := a.Accept()
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	})
}

func benchAccept(b *testing.B, l *net.TCPListener, accept func()) {
	addr := l.Addr().String()
	b.ReportAllocs()
	// CPU time, not wall time: on a shared machine the wall clock
	// measures the neighbours.
	before := processCPU(b)
	for b.Loop() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		accept()
		c.Close()
	}
	b.ReportMetric(float64(processCPU(b)-before)/float64(b.N), "cpu-ns/op")
}

func processCPU(tb testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// acceptNow takes one connection queued on l without waiting: its fd, or
// -1 when the queue is empty (EAGAIN).
func acceptNow(tb testing.TB, l *net.TCPListener) int {
	tb.Helper()
	raw, err := l.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	nfd := -1
	var aerr error
	raw.Control(func(fd uintptr) {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	})
	if aerr == unix.EAGAIN {
		return -1
	}
	if aerr != nil {
		tb.Fatalf("accept4: %v", aerr)
	}
	return nfd
}

// TestDeferAcceptHoldsSilentConnections checks what HTTP listeners rely
// on TCP_DEFER_ACCEPT for: a connection whose client has sent nothing is
// not in the accept queue although the client's connect returned (on
// loopback the whole handshake is done by then), and once the client
// writes, accept returns it with the bytes already readable, so the first
// read does not return EAGAIN. The control, without the option, has it
// queued at once with nothing to read.
func TestDeferAcceptHoldsSilentConnections(t *testing.T) {
	for _, deferred := range []bool{true, false} {
		t.Run(map[bool]string{true: "deferred", false: "control"}[deferred], func(t *testing.T) {
			l := listenNoDelay(t, false)
			if deferred {
				if err := setDeferAccept(l, deferAcceptSeconds); err != nil {
					t.Fatal(err)
				}
			}
			c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fd := acceptNow(t, l)
			if deferred && fd >= 0 {
				unix.Close(fd)
				t.Fatal("a connection that sent nothing was accepted: TCP_DEFER_ACCEPT did not hold it")
			}
			if !deferred {
				if fd < 0 {
					t.Fatal("control: the connection was not queued after its connect returned")
				}
				defer unix.Close(fd)
				if _, err := unix.Read(fd, make([]byte, 64)); err != unix.EAGAIN {
					t.Fatalf("control: first read of a silent connection: %v, want EAGAIN", err)
				}
				return
			}
			const req = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			// Loopback delivers within the write; bounded anyway.
			deadline := time.Now().Add(5 * time.Second)
			for fd = acceptNow(t, l); fd < 0 && time.Now().Before(deadline); fd = acceptNow(t, l) {
				time.Sleep(time.Millisecond)
			}
			if fd < 0 {
				t.Fatal("the connection was not accepted within 5s of its first bytes")
			}
			defer unix.Close(fd)
			b := make([]byte, 64)
			n, err := unix.Read(fd, b)
			if err != nil || string(b[:n]) != req {
				t.Fatalf("first read of the accepted connection: %q, %v; want the request", b[:max(n, 0)], err)
			}
		})
	}
}

// TestHTTPListenerDefersAccept: every socket of an HTTP listener has
// TCP_DEFER_ACCEPT set (two workers, so two SO_REUSEPORT sockets), and a
// TCP listener's none, as its server may speak first.
func TestHTTPListenerDefersAccept(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(be.Close)
	cfg := tcpConfig(hostOf(be.URL), 0)
	cfg.Listeners = append(cfg.Listeners, httpListener("web", toCluster("/", "backend")))
	m := startManager(t, cfg, 2)
	for _, ml := range m.listeners {
		want := 0
		if ml.protocol == config.ProtocolHTTP {
			want = deferAcceptSeconds
		}
		if len(ml.sockets) != 2 {
			t.Fatalf("listener %q: %d sockets, want one per worker", ml.name, len(ml.sockets))
		}
		for _, s := range ml.sockets {
			raw, err := s.ln.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var got, quickACK, proto int
			var gerr, qerr, perr error
			raw.Control(func(fd uintptr) {
				got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT)
				quickACK, qerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK)
				proto, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
			})
			if gerr != nil || perr != nil {
				t.Fatal(gerr, perr)
			}
			if proto == unix.IPPROTO_MPTCP {
				// Without the steering program Go listens with MPTCP,
				// whose listener takes no TCP_QUICKACK.
				quickACK, qerr = b2i(ml.protocol != config.ProtocolHTTP), nil
			}
			if qerr != nil {
				t.Fatal(qerr)
			}
			if got != want {
				t.Errorf("listener %q (%s) worker %d: TCP_DEFER_ACCEPT %d, want %d", ml.name, ml.protocol, s.owner, got, want)
			}
			// The delayed first ACK: TCP_QUICKACK reads 0 once cleared.
			if wantQuick := b2i(ml.protocol != config.ProtocolHTTP); quickACK != wantQuick {
				t.Errorf("listener %q (%s) worker %d: TCP_QUICKACK %d, want %d", ml.name, ml.protocol, s.owner, quickACK, wantQuick)
			}
		}
	}
	// And the HTTP listener still serves.
	if resp, _ := get(t, newClient(t), "http://"+addr(t, m, "web")+"/"); resp.StatusCode != 200 {
		t.Fatalf("GET through the HTTP listener: %d", resp.StatusCode)
	}
}

// TestDrainServesDeferredConnection: a client whose connect has returned
// but who has not yet sent its request when the last generation stops
// accepting is still served: with TCP_DEFER_ACCEPT its connection is not
// in the accept queue yet, and a socket closed at the first empty queue
// (as before awaitDeferred) dropped it, so its request was answered with
// a reset.
//
// The slow client takes 300ms to send it (a loaded machine: the drain's
// old fixed 100ms grace reset it; now, where the steering program refuses
// new connections, the socket stays open while the kernel holds the
// connection, up to queueDrainMax).
func TestDrainServesDeferredConnection(t *testing.T) {
	for _, delay := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprint("request after ", delay), func(t *testing.T) { drainServesDeferred(t, delay) })
	}
}

func drainServesDeferred(t *testing.T, delay time.Duration) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(be.Close)
	m := startManager(t, proxyConfig(hostOf(be.URL)), 1)
	if delay > unrefusedGrace && m.listeners[0].steer == nil {
		t.Skipf("a client %v slow is waited for only where the steering program refuses new connections (CAP_BPF); here: %v", delay, m.listeners[0].steerErr)
	}
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{}) }()
	waitFor(t, 5*time.Second, "accepting to stop", m.acceptStopped)
	if delay > 0 {
		time.Sleep(delay) // the scenario: a client slow to send, not a wait for readiness
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a request sent just after the drain began, on a connection made before it: %v, want a response", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "ok" || !resp.Close {
		t.Errorf("response: %d %q close=%v; want 200 \"ok\" with Connection: close", resp.StatusCode, body, resp.Close)
	}
	if err := <-drained; err != nil {
		t.Errorf("drain: %v", err)
	}
}

// TestDrainLeavesHandedOverSocketsToTheSuccessor: a drain whose sockets a
// successor has taken over (DrainOptions.HandedOver) does not keep
// accepting on them for the deferred-accept grace: a connection made
// after accepting stopped is the successor's. The "successor" here is a
// listener on a dup of the worker's socket, as a next generation's is;
// without the steering program, which a real successor replaces with its
// own and which would otherwise refuse the connection for this one.
func TestDrainLeavesHandedOverSocketsToTheSuccessor(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(be.Close)
	m := startManager(t, proxyConfig(hostOf(be.URL), func(l *config.Listener) { l.Balance = config.BalanceKernel }), 1)
	files, err := m.SocketDups()
	if err != nil {
		t.Fatal(err)
	}
	handed := make(map[SocketKey]bool)
	var successor *net.TCPListener
	for k, f := range files {
		handed[k] = true
		ln, err := adopt(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		successor = ln
	}
	if len(handed) != 1 {
		t.Fatalf("%d sockets, want 1", len(handed))
	}
	drained := make(chan error, 1)
	go func() {
		drained <- m.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HandedOver: handed})
	}()
	waitFor(t, 5*time.Second, "accepting to stop", m.acceptStopped)
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const req = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	successor.SetDeadline(time.Now().Add(5 * time.Second))
	sc, err := successor.AcceptTCP()
	if err != nil {
		t.Fatalf("the successor did not get the connection made after the drain began (the draining generation took it?): %v", err)
	}
	defer sc.Close()
	sc.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, len(req))
	if _, err := io.ReadFull(sc, b); err != nil || string(b) != req {
		t.Fatalf("the successor read %q, %v; want the request", b, err)
	}
	if err := <-drained; err != nil {
		t.Errorf("drain: %v", err)
	}
}
