package workers

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/workers/steering"
)

// The tests of UpdateListeners (update.go). Each runs against the way
// listeners changed before it, too: with HOTPROXY_TEST_LDS_REBUILD=1 the
// harness builds a whole new Manager on the serving one's sockets and
// drains the old one, as server.replaceWorkers did, and the tests fail
// there (that is what they are for).
const ldsRebuildEnv = "HOTPROXY_TEST_LDS_REBUILD"

// ldsHarness serves a sequence of configurations, each applied to the
// serving Manager by UpdateListeners (or, rebuilding, by a new Manager).
type ldsHarness struct {
	tb      testing.TB
	n       int
	rebuild bool
	m       *Manager
	tls     map[string]*tls.Config // the ServerTLS of the last config
}

func newLDSHarness(tb testing.TB, cfg *config.Config, n int) *ldsHarness {
	tb.Helper()
	h := &ldsHarness{tb: tb, n: n, rebuild: os.Getenv(ldsRebuildEnv) == "1"}
	snap := h.snapshot(cfg)
	m, err := New(Options{Concurrency: n, Logger: testLogger(), ServerTLS: h.tls}, snap)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { h.m.Close() })
	m.Start()
	h.m = m
	return h
}

func (h *ldsHarness) snapshot(cfg *config.Config) *Snapshot {
	h.tb.Helper()
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, h.n)
	if err != nil {
		h.tb.Fatalf("BuildSnapshotN: %v", err)
	}
	h.tls = map[string]*tls.Config{}
	for i := range cfg.Listeners {
		if l := &cfg.Listeners[i]; l.TLS != nil {
			h.tls[l.Name] = serverTLSFor(h.tb, l)
		}
	}
	return snap
}

// apply serves cfg; the channel closes once what it retired has drained.
func (h *ldsHarness) apply(cfg *config.Config, opts UpdateOptions) <-chan struct{} {
	h.tb.Helper()
	snap := h.snapshot(cfg)
	opts.ServerTLS = h.tls
	if !h.rebuild {
		u, err := h.m.UpdateListeners(snap, opts)
		if err != nil {
			h.tb.Fatalf("UpdateListeners: %v", err)
		}
		return u.Done()
	}
	// The whole-Manager rebuild, as server.replaceWorkers did it.
	old := h.m
	inherited, err := old.Sockets()
	if err != nil {
		h.tb.Fatal(err)
	}
	handedOver := map[SocketKey]bool{}
	for k := range inherited {
		handedOver[k] = true
	}
	m, err := New(Options{Concurrency: h.n, Logger: testLogger(), Inherited: inherited, Stats: old.Stats(), ServerTLS: h.tls}, snap)
	if err != nil {
		h.tb.Fatalf("New: %v", err)
	}
	for k, f := range m.Unused() {
		delete(handedOver, k)
		f.Close()
	}
	m.Start()
	h.m = m
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		if opts.ShutdownTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, opts.ShutdownTimeout)
			defer cancel()
		}
		old.Drain(ctx, DrainOptions{HTTPTimeout: opts.HTTPTimeout, HandedOver: handedOver})
		old.Close()
	}()
	h.tb.Cleanup(func() { old.Close(); <-done })
	return done
}

func (h *ldsHarness) addr(name string) string { return addr(h.tb, h.m, name) }

// fixedAddr is a loopback address for a listener, free when asked: with
// port 0, a new Manager rebuilt on inherited sockets could not tell two
// listeners apart by address.
func fixedAddr(tb testing.TB) string { return deadPort(tb) }

// directListener is an http listener at address answering body.
func directListener(name, address, body string) config.Listener {
	l := httpListener(name, config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: body}})
	l.Address = address
	return l
}

// keepAliveConn is one HTTP/1.1 client connection that sends request
// after request on the same socket and fails the test on anything but a
// 200 that keeps the connection open.
type keepAliveConn struct {
	tb   testing.TB
	c    net.Conn
	br   *bufio.Reader
	port int // the client's local port: the same connection throughout
	host string
}

func dialKeepAlive(tb testing.TB, addr string) *keepAliveConn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &keepAliveConn{tb: tb, c: c, br: bufio.NewReader(c), port: c.LocalAddr().(*net.TCPAddr).Port, host: addr}
}

// do sends one request and returns the body, or an error saying what went
// wrong with the connection.
func (k *keepAliveConn) do(path string) (string, error) {
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, k.host); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return "", fmt.Errorf("body: %w", err)
	case resp.StatusCode != 200:
		return "", fmt.Errorf("status %d: %q", resp.StatusCode, b)
	case resp.Close:
		return "", fmt.Errorf("the response says Connection: close (%q)", b)
	}
	return string(b), nil
}

// keepAliveLoad sends requests on conn until stop, counting them, and
// reports the first failure.
func keepAliveLoad(conn *keepAliveConn, path string, stop <-chan struct{}) (served *atomic.Int64, failed <-chan error) {
	served = new(atomic.Int64)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := conn.do(path); err != nil {
				errc <- err
				return
			}
			served.Add(1)
		}
	}()
	return served, errc
}

// TestUpdateListenersLeavesOthersAlone: a keep-alive HTTP/1.1 client of
// listener "b" keeps its very connection, served throughout and never
// told to close, while listener "a" is added, changed and removed.
func TestUpdateListenersLeavesOthersAlone(t *testing.T) {
	be := echoBackend(t)
	bAddr, aAddr := fixedAddr(t), fixedAddr(t)
	cfgWith := func(a ...config.Listener) *config.Config {
		b := httpListener("b", toCluster("/", "backend"))
		b.Address = bAddr
		return &config.Config{Listeners: append([]config.Listener{b}, a...), Clusters: []config.Cluster{cluster("backend", hostOf(be.URL))}}
	}
	h := newLDSHarness(t, cfgWith(), 2)
	conn := dialKeepAlive(t, h.addr("b"))
	if _, err := conn.do("/first"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	served, failed := keepAliveLoad(conn, "/load", stop)
	waitServed := func(what string, more int64) {
		t.Helper()
		want := served.Load() + more
		deadline := time.Now().Add(10 * time.Second)
		for served.Load() < want {
			select {
			case err := <-failed:
				t.Fatalf("%s: b's keep-alive connection: %v", what, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: b served %d requests, want %d", what, served.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitServed("before", 20)
	opts := UpdateOptions{HTTPTimeout: 2 * time.Second, ShutdownTimeout: 3 * time.Second}

	// Added: served at once.
	a := directListener("a", aAddr, "a1")
	<-h.apply(cfgWith(a), opts)
	if resp, body := get(t, newClient(t), "http://"+h.addr("a")+"/"); resp.StatusCode != 200 || body != "a1" {
		t.Fatalf("added listener: %d %q", resp.StatusCode, body)
	}
	waitServed("after the add", 20)

	// Changed: new settings, same address. What it retires drains for
	// longer than drainIdleGrace, in which b's client keeps sending.
	a.IdleTimeout = dur(42 * time.Second)
	a.Routes[0].DirectResponse.Body = "a2"
	done := h.apply(cfgWith(a), opts)
	if resp, body := get(t, newClient(t), "http://"+aAddr+"/"); resp.StatusCode != 200 || body != "a2" {
		t.Fatalf("changed listener: %d %q", resp.StatusCode, body)
	}
	waitServed("while the changed listener drains", 20)
	<-done
	time.Sleep(drainIdleGrace + 200*time.Millisecond) // what a drain of b would close: nothing
	waitServed("after the change", 20)

	// Removed: refused once drained; b unaffected.
	<-h.apply(cfgWith(), opts)
	if c, err := net.DialTimeout("tcp", aAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("removed listener still accepts")
	}
	time.Sleep(drainIdleGrace + 200*time.Millisecond)
	waitServed("after the removal", 20)
	close(stop)
	if err := <-failed; err != nil {
		t.Fatalf("b's keep-alive connection: %v", err)
	}
	if _, err := conn.do("/last"); err != nil {
		t.Fatalf("b's connection after all changes: %v", err)
	}
	if got := conn.c.LocalAddr().(*net.TCPAddr).Port; got != conn.port {
		t.Fatalf("b's client moved from port %d to %d", conn.port, got)
	}
	// One connection, counted once, on b.
	if got := counter(h.m, "listener.b."+statCxTotal); got != 1 {
		t.Fatalf("listener.b.downstream_cx_total = %d, want 1 (b's client never reconnected)", got)
	}
	t.Logf("b served %d requests on one connection", served.Load())
}

// TestUpdateListenersTCPSessionOutlivesRemoval: a TCP-proxy session on
// listener "b" stays open, echoing, well past the shutdown timeout of the
// drain of listener "a", which is removed.
func TestUpdateListenersTCPSessionOutlivesRemoval(t *testing.T) {
	echo := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
	bAddr, aAddr := fixedAddr(t), fixedAddr(t)
	cfgWith := func(a ...config.Listener) *config.Config {
		b := tcpListener("b", "echo")
		b.Address = bAddr
		return &config.Config{Listeners: append([]config.Listener{b}, a...), Clusters: []config.Cluster{cluster("echo", echo)}}
	}
	h := newLDSHarness(t, cfgWith(directListener("a", aAddr, "a")), 2)
	s := dialTCP(t, h.addr("b"))
	ping := func(what string) {
		t.Helper()
		if _, err := s.Write([]byte("ping")); err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		if _, err := io.ReadFull(s, make([]byte, 4)); err != nil {
			t.Fatalf("%s: b's TCP session: %v", what, err)
		}
	}
	ping("before")
	const shutdown = 300 * time.Millisecond
	start := time.Now()
	<-h.apply(cfgWith(), UpdateOptions{HTTPTimeout: shutdown / 2, ShutdownTimeout: shutdown})
	if time.Since(start) < 3*shutdown {
		time.Sleep(3*shutdown - time.Since(start))
	}
	ping("past the removed listener's shutdown timeout")
	if got := gauge(h.m, "listener.b."+statCxActive); got != 1 {
		t.Fatalf("listener.b.downstream_cx_active = %d, want 1", got)
	}
}

// TestUpdateListenersRemovedUnderLoad: listener "a", under
// connection-per-request load, is changed (on its sockets) and then
// removed: every connection the kernel accepted is answered (0 failed,
// nothing reset), then connects are refused; "b"'s keep-alive client is
// not even told to close. With balance = "kernel" nothing refuses new
// connections while the removed listener empties its queue, and the
// emptying is bounded (queueDrainMax: a drain's documented fallback, the
// same at a hot restart), so there only the change must lose nothing.
func TestUpdateListenersRemovedUnderLoad(t *testing.T) {
	for _, balance := range []string{config.BalanceLeastConn, config.BalanceKernel} {
		t.Run(balance, func(t *testing.T) {
			if balance != config.BalanceKernel {
				if err := steering.Probe(); err != nil {
					t.Skipf("balance %s needs the eBPF steering program: %v", balance, err)
				}
			}
			testRemovedUnderLoad(t, balance, pacedLoad)
		})
	}
}

// TestUpdateListenersRemovedUnderFlood is TestUpdateListenersRemovedUnderLoad
// with its clients dialling as fast as they can, no pause between
// connections, on the listener whose steering program refuses new
// connections before its sockets close: nothing the kernel accepted may
// be reset. "proc": the look for handshakes under way reads /proc/net/tcp,
// as where the netlink one is refused (a seccomp profile, a kernel without
// inet_diag); each look then costs tens of milliseconds per ten thousand
// TCP sockets in the namespace (more under the race detector), so a loaded
// host spends the whole queue-emptying bound in a few looks, and the
// connections that completed meanwhile were reset (13 of 40 runs failed,
// none since).
func TestUpdateListenersRemovedUnderFlood(t *testing.T) {
	if err := steering.Probe(); err != nil {
		t.Skipf("balance %s needs the eBPF steering program: %v", config.BalanceLeastConn, err)
	}
	t.Run("sock_diag", func(t *testing.T) {
		testRemovedUnderLoad(t, config.BalanceLeastConn, floodLoad)
	})
	t.Run("proc", func(t *testing.T) {
		refuseSockDiag(t)
		testRemovedUnderLoad(t, config.BalanceLeastConn, floodLoad)
	})
}

// refuseSockDiag makes the netlink look for handshakes under way fail
// for the rest of the test, so that handshakesPending reads /proc.
func refuseSockDiag(tb testing.TB) {
	tb.Helper()
	saved, savedFailed := sockDiagLook, sockDiagFailed.Load()
	sockDiagLook = func(uint8, int) (bool, error) { return false, errors.New("refused by the test") }
	tb.Cleanup(func() { sockDiagLook = saved; sockDiagFailed.Store(savedFailed) })
}

// TestUpdateListenersRemovedAfterSlowLook: the look of a removed
// listener's drain for handshakes under way ends after the whole
// queue-emptying bound has passed (as one can on a host with very many
// TCP sockets, or a loaded one), and meanwhile the connections it waits
// for have completed into the queues. Nothing new can enter them (the
// program refuses new connections), so they are all served; the old code
// took one more from each queue and reset the rest with the close.
func TestUpdateListenersRemovedAfterSlowLook(t *testing.T) {
	h, aml, aAddr := slowLookHarness(t)
	check := holdUntilSlowLook(t, aml, aAddr)
	select {
	case <-h.apply(&config.Config{Listeners: []config.Listener{directListener("b", h.addr("b"), "b")}}, UpdateOptions{HTTPTimeout: 5 * time.Second, ShutdownTimeout: 5 * time.Second}):
	case <-time.After(20 * time.Second):
		t.Fatal("the removed listener's drain did not end within 20s")
	}
	check()
}

// TestDrainAfterSlowLook is TestUpdateListenersRemovedAfterSlowLook for a
// generation's last drain (no successor: the sockets close for good, as
// a hot restart's parent closes a listener its successor dropped).
func TestDrainAfterSlowLook(t *testing.T) {
	h, aml, aAddr := slowLookHarness(t)
	check := holdUntilSlowLook(t, aml, aAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.m.Drain(ctx, DrainOptions{HTTPTimeout: 5 * time.Second}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	check()
}

// slowLookHarness serves listeners "b" and "a" (least_conn, steered) on
// two workers.
func slowLookHarness(t *testing.T) (*ldsHarness, *mlistener, string) {
	t.Helper()
	if err := steering.Probe(); err != nil {
		t.Skipf("balance %s needs the eBPF steering program: %v", config.BalanceLeastConn, err)
	}
	aAddr := fixedAddr(t)
	a := directListener("a", aAddr, "a")
	a.Balance = config.BalanceLeastConn
	h := newLDSHarness(t, &config.Config{Listeners: []config.Listener{directListener("b", fixedAddr(t), "b"), a}}, 2)
	for _, ml := range h.m.currentListeners() {
		if ml.name == "a" && ml.steer != nil {
			return h, ml, aAddr
		}
	}
	t.Fatalf("listener a runs no steering program")
	return nil, nil, ""
}

// holdUntilSlowLook opens connections to listener aml at aAddr that its
// drain finds mid-handshake, and makes the drain's first look for them
// send their requests and end only after the queue-emptying bound has
// passed. The returned check, called once the drain is over, fails the
// test unless every connection got its response.
func holdUntilSlowLook(t *testing.T, aml *mlistener, aAddr string) (check func()) {
	t.Helper()
	_, portStr, _ := net.SplitHostPort(aAddr)
	aPort, _ := strconv.Atoi(portStr)
	// Connected, nothing sent yet: TCP_DEFER_ACCEPT holds them in the
	// kernel mid-handshake, out of the queues, which is what the drain's
	// look finds. Ten on two sockets: at least one socket has five.
	const n = 10
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.DialTimeout("tcp", aAddr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		conns[i] = c
	}
	real := sockDiagLook
	var looks atomic.Int32
	var sendOnce sync.Once
	sent := make(chan error, 1)
	sockDiagLook = func(family uint8, port int) (bool, error) {
		if port != aPort {
			return real(family, port)
		}
		looks.Add(1)
		sendOnce.Do(func() {
			var err error
			for _, c := range conns {
				if _, werr := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"); werr != nil {
					err = errors.Join(err, werr)
				}
			}
			sent <- err
		})
		// The look's cost, not a synchronisation: the bound is spent
		// when it returns.
		if left := time.Duration(aml.emptyQueuesUntil.Load() - monotime()); left > 0 {
			time.Sleep(left + 50*time.Millisecond)
		}
		return real(family, port)
	}
	t.Cleanup(func() { sockDiagLook = real })
	return func() {
		t.Helper()
		if looks.Load() == 0 {
			t.Fatal("the drain never looked for handshakes under way: the connections were queued before it stopped, and the test tested nothing")
		}
		if err := <-sent; err != nil {
			t.Fatalf("sending the requests: %v", err)
		}
		served := 0
		for i, c := range conns {
			err := readAnswer(c, "a")
			if err != nil {
				t.Errorf("connection %d (from %v), completed while the look was under way: %v", i, c.LocalAddr(), err)
				continue
			}
			served++
		}
		t.Logf("%d of %d connections served after a look that outlasted the bound (%d looks)", served, n, looks.Load())
	}
}

// loadShape is how testRemovedUnderLoad's clients dial: how many, and the
// pause after each connection served (0: none, a flood).
type loadShape struct {
	clients int
	pause   time.Duration
}

var (
	// pacedLoad: a steady stream of connections, not a flood of the
	// accept queue.
	pacedLoad = loadShape{clients: 4, pause: time.Millisecond}
	// floodLoad: connection after connection with no pause, sized so
	// that a busy 2-core machine keeps up (16 connections in flight at
	// most: the accept queue never overflows into SYN cookies).
	floodLoad = loadShape{clients: 16}
)

// testRemovedUnderLoad changes listener "a" (balance) under load, then
// removes it.
func testRemovedUnderLoad(t *testing.T, balance string, shape loadShape) {
	bAddr, aAddr := fixedAddr(t), fixedAddr(t)
	b := directListener("b", bAddr, "b")
	a := directListener("a", aAddr, "a")
	a.Balance = balance
	h := newLDSHarness(t, &config.Config{Listeners: []config.Listener{b, a}}, 2)
	conn := dialKeepAlive(t, h.addr("b"))
	stop := make(chan struct{})
	bServed, bFailed := keepAliveLoad(conn, "/", stop)

	var served, refused atomic.Int64
	var removing atomic.Bool
	var mu sync.Mutex
	var failures, removalFailures []string
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if removing.Load() {
			removalFailures = append(removalFailures, err.Error())
		} else {
			failures = append(failures, err.Error())
		}
	}
	var wg sync.WaitGroup
	loadStop := make(chan struct{})
	for range shape.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-loadStop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", aAddr, 5*time.Second)
				if err != nil {
					if errors.Is(err, syscall.ECONNREFUSED) {
						refused.Add(1)
					} else {
						fail(fmt.Errorf("dial: %w", err))
					}
					time.Sleep(2 * time.Millisecond) // no busy loop on a refusing port
					continue
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				_, werr := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
				err = readAnswer(c, "a")
				c.Close()
				if err != nil {
					fail(fmt.Errorf("a connection the kernel accepted (from %v; write: %v): %w", c.LocalAddr(), werr, err))
					time.Sleep(2 * time.Millisecond)
					continue
				}
				served.Add(1)
				if shape.pause > 0 {
					time.Sleep(shape.pause)
				}
			}
		}()
	}
	waitFor(t, 10*time.Second, "load on a", func() bool { return served.Load() >= 200 })
	// Changed under load, on its sockets: their steering moves to the
	// new instance's program.
	a.IdleTimeout = dur(42 * time.Second)
	<-h.apply(&config.Config{Listeners: []config.Listener{b, a}}, UpdateOptions{HTTPTimeout: 2 * time.Second, ShutdownTimeout: 3 * time.Second})
	if balance != config.BalanceKernel && !h.rebuild {
		for _, ml := range h.m.currentListeners() {
			if ml.name == "a" && ml.steer == nil {
				t.Fatalf("the changed listener runs no steering program: %v", ml.steerErr)
			}
		}
	}
	atChange := served.Load()
	waitFor(t, 10*time.Second, "load on the changed a", func() bool { return served.Load() >= atChange+200 })
	removing.Store(true)
	<-h.apply(&config.Config{Listeners: []config.Listener{b}}, UpdateOptions{HTTPTimeout: 2 * time.Second, ShutdownTimeout: 3 * time.Second})
	waitFor(t, 10*time.Second, "connects to the removed listener refused", func() bool { return refused.Load() >= 50 })
	close(loadStop)
	wg.Wait()
	for _, f := range failures {
		t.Errorf("before the removal: %s", f)
	}
	for _, f := range removalFailures {
		if balance == config.BalanceKernel {
			t.Logf("removal, balance kernel (nothing refuses new connections while the queue empties): %s", f)
			continue
		}
		t.Errorf("during the removal: %s", f)
	}
	close(stop)
	if err := <-bFailed; err != nil {
		t.Fatalf("b's keep-alive connection: %v", err)
	}
	t.Logf("a: %d served, %d refused after the removal; b: %d on one connection", served.Load(), refused.Load(), bServed.Load())
	if got := counter(h.m, "listener.b."+statCxTotal); got != 1 {
		t.Fatalf("listener.b.downstream_cx_total = %d, want 1", got)
	}
}

// TestUpdateListenersChangedSettings: listener "a" changes on the same
// address; a new connection gets the new settings at once, a connection
// in the middle of a request when it changed finishes it with the old
// ones, and "b"'s client keeps its connection.
func TestUpdateListenersChangedSettings(t *testing.T) {
	be := echoBackend(t)
	t.Run("header_timeout", func(t *testing.T) {
		bAddr, aAddr := fixedAddr(t), fixedAddr(t)
		b := directListener("b", bAddr, "b")
		a := httpListener("a", toCluster("/", "backend"))
		a.Address = aAddr
		a.HeaderTimeout = dur(20 * time.Second)
		clusters := []config.Cluster{cluster("backend", hostOf(be.URL))}
		h := newLDSHarness(t, &config.Config{Listeners: []config.Listener{b, a}, Clusters: clusters}, 2)
		bConn := dialKeepAlive(t, h.addr("b"))
		if _, err := bConn.do("/"); err != nil {
			t.Fatal(err)
		}
		// Mid-request: half a head sent.
		old := dialTCP(t, aAddr)
		io.WriteString(old, "GET /old HTTP/1.1\r\nHost: a\r\n")
		waitFor(t, 5*time.Second, "the old connection accepted", func() bool { return gauge(h.m, "listener.a."+statCxActive) == 1 })

		const short = 300 * time.Millisecond
		a.HeaderTimeout = dur(short)
		done := h.apply(&config.Config{Listeners: []config.Listener{b, a}, Clusters: clusters}, UpdateOptions{HTTPTimeout: 10 * time.Second, ShutdownTimeout: 10 * time.Second})
		if got := h.addr("a"); got != aAddr {
			t.Fatalf("changed listener moved from %s to %s", aAddr, got)
		}
		// A new connection that sends half a head is cut at the new
		// header_timeout.
		fresh := dialTCP(t, aAddr)
		io.WriteString(fresh, "GET /new HTTP/1.1\r\nHost: a\r\n")
		start := time.Now()
		fresh.SetDeadline(time.Now().Add(10 * time.Second))
		io.ReadAll(fresh) // a 408 or a plain close, either way an end
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("a new connection was held %v: not the new header_timeout %v", took, short)
		}
		// The old one, past the new timeout, finishes its request under
		// the old one, told to close after it.
		time.Sleep(3 * short)
		io.WriteString(old, "\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(old), nil)
		if err != nil {
			t.Fatalf("the request in the middle of its head when the listener changed: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(body), "Path: /old") {
			t.Fatalf("the old connection's request: %d %q", resp.StatusCode, body)
		}
		if !resp.Close {
			t.Errorf("the replaced listener's response lacks Connection: close")
		}
		<-done
		if _, err := bConn.do("/"); err != nil {
			t.Fatalf("b's keep-alive connection: %v", err)
		}
	})

	t.Run("certificate", func(t *testing.T) {
		bAddr, aAddr := fixedAddr(t), fixedAddr(t)
		b := directListener("b", bAddr, "b")
		a := directListener("a", aAddr, "a")
		withTLS(&a) // a.example.com is the default certificate
		h := newLDSHarness(t, &config.Config{Listeners: []config.Listener{b, a}}, 2)
		bConn := dialKeepAlive(t, h.addr("b"))
		if _, err := bConn.do("/"); err != nil {
			t.Fatal(err)
		}
		leaf := func(c *tls.Conn) string { return c.ConnectionState().PeerCertificates[0].Subject.CommonName }
		// An old connection, half its request sent.
		oldCfg := clientTLS(t, "")
		oldCfg.InsecureSkipVerify = true
		old, err := tls.Dial("tcp", aAddr, oldCfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { old.Close() })
		old.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(old, "GET / HTTP/1.1\r\nHost: a\r\n")
		before := leaf(old)

		a.TLS = &config.ListenerTLS{Certificates: []config.CertificatePair{demoOrg}}
		done := h.apply(&config.Config{Listeners: []config.Listener{b, a}}, UpdateOptions{HTTPTimeout: 10 * time.Second, ShutdownTimeout: 10 * time.Second})
		fresh, err := tls.Dial("tcp", aAddr, oldCfg)
		if err != nil {
			t.Fatal(err)
		}
		fresh.Close()
		if after := leaf(fresh); after == before {
			t.Fatalf("a new connection still gets the old certificate %q", before)
		}
		io.WriteString(old, "\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(old), nil)
		if err != nil {
			t.Fatalf("the old TLS connection's request: %v", err)
		}
		if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "a" {
			t.Fatalf("the old TLS connection's request: %d %q", resp.StatusCode, body)
		}
		old.Close()
		<-done
		if _, err := bConn.do("/"); err != nil {
			t.Fatalf("b's keep-alive connection: %v", err)
		}
	})
}

// TestUpdateListenersOneBudget: server.max_connections bounds the old
// instance of a changed listener and the new one together, and so does
// the listener's own max_connections: never more open than the bound.
func TestUpdateListenersOneBudget(t *testing.T) {
	for _, bound := range []string{"server", "listener"} {
		t.Run(bound, func(t *testing.T) {
			echo := rawBackend(t, func(c net.Conn) { io.Copy(c, c) })
			const max = 4
			aAddr := fixedAddr(t)
			cfg := func(idle time.Duration) *config.Config {
				a := tcpListener("a", "echo")
				a.Address, a.IdleTimeout = aAddr, dur(idle)
				c := &config.Config{Listeners: []config.Listener{a}, Clusters: []config.Cluster{cluster("echo", echo)}}
				if bound == "server" {
					c.Server.MaxConnections = max
				} else {
					c.Listeners[0].MaxConnections = max
				}
				return c
			}
			h := newLDSHarness(t, cfg(time.Minute), 2)
			// echoes reports whether s is served (not closed at once).
			echoes := func(s *net.TCPConn) bool {
				s.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := s.Write([]byte("ping")); err != nil {
					return false
				}
				_, err := io.ReadFull(s, make([]byte, 4))
				return err == nil
			}
			for i := range max - 1 {
				if s := dialTCP(t, aAddr); !echoes(s) {
					t.Fatalf("session %d under the bound not served", i)
				}
			}
			h.apply(cfg(2*time.Minute), UpdateOptions{ShutdownTimeout: time.Minute})
			servedAfter := 0
			for range max {
				if echoes(dialTCP(t, aAddr)) {
					servedAfter++
				}
			}
			if servedAfter != 1 {
				t.Fatalf("after the change, %d new sessions served beside the %d old ones, want 1 (bound %d)", servedAfter, max-1, max)
			}
			if open, _ := h.m.OpenConnections(); open > max {
				t.Fatalf("%d connections open, bound %d", open, max)
			}
		})
	}
}

// TestUpdateListenersThenHandOver: after listeners were added and changed
// in place, a hot restart's Sockets hands over the current ones (the
// changed listener's new instance, on the same socket), a next Manager
// serves them with nothing refused, and the old Manager's Drain and Close
// end the listener still draining from the change too.
func TestUpdateListenersThenHandOver(t *testing.T) {
	if os.Getenv(ldsRebuildEnv) == "1" {
		t.Skip("UpdateListeners only: the rebuild has no listener draining alone")
	}
	aAddr, bAddr := fixedAddr(t), fixedAddr(t)
	h := newLDSHarness(t, &config.Config{Listeners: []config.Listener{directListener("a", aAddr, "a1")}}, 2)
	// A TCP-proxy session on the old "a" would outlive everything; an
	// HTTP request in flight keeps the changed listener's drain going.
	slowArrived, release := make(chan struct{}), make(chan struct{})
	slow := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/slow" {
			close(slowArrived)
			<-release
		}
		// Until the drain stops it, the old Manager's "a" serves too.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
	})
	a := httpListener("a", toCluster("/", "slow"))
	a.Address = aAddr
	clusters := []config.Cluster{cluster("slow", slow)}
	h.apply(&config.Config{Listeners: []config.Listener{a}, Clusters: clusters}, UpdateOptions{})
	inFlight := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + aAddr + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		inFlight <- err
	}()
	<-slowArrived
	a.IdleTimeout = dur(time.Minute)
	retired := h.apply(&config.Config{Listeners: []config.Listener{a, directListener("b", bAddr, "b")}, Clusters: clusters}, UpdateOptions{})
	old := h.m
	files, err := old.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for k := range files {
		keys[k.Address]++
	}
	if keys[aAddr] != 2 || keys[bAddr] != 2 || len(keys) != 2 {
		t.Fatalf("Sockets handed over %v, want a's and b's two each", keys)
	}
	handedOver := map[SocketKey]bool{}
	for k := range files {
		handedOver[k] = true
	}
	next, err := New(Options{Concurrency: 2, Logger: testLogger(), Inherited: files, Stats: old.Stats()}, h.snapshot(&config.Config{Listeners: []config.Listener{directListener("a", aAddr, "a3"), directListener("b", bAddr, "b")}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Close() })
	if n := len(next.Unused()); n != 0 {
		t.Fatalf("the next Manager left %d sockets unused", n)
	}
	next.Start()
	drained := make(chan error, 1)
	go func() {
		drained <- old.Drain(ctxTimeout(t, 20*time.Second), DrainOptions{HTTPTimeout: 10 * time.Second, HandedOver: handedOver})
	}()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	waitFor(t, 10*time.Second, "the next Manager serving a", func() bool {
		resp, body := get(t, c, "http://"+aAddr+"/")
		return resp.StatusCode == 200 && body == "a3"
	})
	select {
	case err := <-drained:
		t.Fatalf("the old Manager drained (%v) with a request in flight on its replaced listener", err)
	default:
	}
	close(release)
	if err := <-inFlight; err != nil {
		t.Fatalf("the request in flight on the replaced listener: %v", err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	select {
	case <-retired:
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced listener's drain did not end with the Manager's")
	}
	if err := old.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestUpdateListenersHeartbeats: the accept loops of a listener that an
// update removed stop beating once it stops accepting; the watchdog's ages
// leave them out, and those of the listeners added are in.
func TestUpdateListenersHeartbeats(t *testing.T) {
	if os.Getenv(ldsRebuildEnv) == "1" {
		t.Skip("UpdateListeners only")
	}
	aAddr, bAddr, cAddr := fixedAddr(t), fixedAddr(t), fixedAddr(t)
	cfg := func(ls ...config.Listener) *config.Config { return &config.Config{Listeners: ls} }
	a, b, c := directListener("a", aAddr, "a"), directListener("b", bAddr, "b"), directListener("c", cAddr, "c")
	first := cfg(a, b)
	first.SetDefaults()
	snap, err := BuildSnapshotN(first, Identity{Version: "test"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	const interval = 20 * time.Millisecond
	m, err := New(Options{Concurrency: 2, Logger: testLogger(), HeartbeatInterval: interval}, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Start()
	next := cfg(b, c)
	next.SetDefaults()
	snap, err = BuildSnapshotN(next, Identity{Version: "test"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Half a request keeps a's drain going for a while.
	held := dialTCP(t, aAddr)
	io.WriteString(held, "GET / HTTP/1.1\r\n")
	waitFor(t, 5*time.Second, "a's connection accepted", func() bool { return gauge(m, "listener.a."+statCxActive) == 1 })
	u, err := m.UpdateListeners(snap, UpdateOptions{HTTPTimeout: 2 * time.Second, ShutdownTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bound := 25 * interval
	// sampleAges looks at every worker's heartbeat for 2*bound and at
	// least 10 times; during: a's drain must still be going on.
	sampleAges := func(when string, during bool) {
		deadline := time.Now().Add(2 * bound)
		for samples := 0; time.Now().Before(deadline) || samples < 10; samples++ {
			if during {
				select {
				case <-u.Done():
					t.Fatal("a's drain ended before the heartbeats were sampled during it")
				default:
				}
			}
			ages := m.WorkerHeartbeatAges(nil)
			if len(ages) != 2 {
				t.Fatalf("%d ages for 2 workers", len(ages))
			}
			for w, age := range ages {
				if age > bound {
					t.Fatalf("worker %d's heartbeat is %s old with an interval of %s %s", w, age, interval, when)
				}
			}
			time.Sleep(interval)
		}
	}
	sampleAges("while removed listener a drains", true)
	<-u.Done()
	sampleAges("after listener a was removed", false)
	m.mu.Lock()
	loops := map[string]int{}
	for _, lb := range m.beats {
		loops[lb.ml.name]++
	}
	m.mu.Unlock()
	if loops["a"] != 0 || loops["b"] != 2 || loops["c"] != 2 {
		t.Fatalf("heartbeats by listener %v, want b's and c's two each, none of a's", loops)
	}
}

// h2Outcome reads rc's frames until a GOAWAY (true), the end of stream's
// response with the status it had, or d passing (neither: "", false).
func (rc *rawH2Conn) until(tb testing.TB, d time.Duration, stream uint32) (status string, goAway bool) {
	tb.Helper()
	rc.c.SetReadDeadline(time.Now().Add(d))
	defer rc.c.SetReadDeadline(time.Time{})
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return "", false
			}
			tb.Fatalf("reading frames: %v", err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			return "", true
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				rc.fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == stream {
				status = f.PseudoValue("status")
				if f.StreamEnded() {
					return status, false
				}
			}
		case *http2.DataFrame:
			if f.StreamID == stream && f.StreamEnded() {
				return status, false
			}
		}
	}
}

// TestUpdateListenersHTTP2: the HTTP/2 connection of a replaced listener
// gets its GOAWAY; that of a listener the update left alone gets none and
// goes on serving streams.
func TestUpdateListenersHTTP2(t *testing.T) {
	aAddr, bAddr := fixedAddr(t), fixedAddr(t)
	cfg := func(aBody string) *config.Config {
		a, b := directListener("a", aAddr, aBody), directListener("b", bAddr, "b")
		h2cListener(&a)
		h2cListener(&b)
		a.IdleTimeout = dur(time.Minute + time.Duration(len(aBody))*time.Second) // a's body changes its settings
		return &config.Config{Listeners: []config.Listener{a, b}}
	}
	h := newLDSHarness(t, cfg("a"), 2)
	ra, rb := dialRawH2(t, aAddr), dialRawH2(t, bAddr)
	ra.get(t, 1, aAddr, "/")
	rb.get(t, 1, bAddr, "/")
	for name, rc := range map[string]*rawH2Conn{"a": ra, "b": rb} {
		if status, goAway := rc.until(t, 5*time.Second, 1); status != "200" || goAway {
			t.Fatalf("%s before the change: status %q, GOAWAY %v", name, status, goAway)
		}
	}
	h.apply(cfg("a, changed"), UpdateOptions{HTTPTimeout: 10 * time.Second, ShutdownTimeout: 10 * time.Second})
	if _, goAway := ra.until(t, 5*time.Second, 0); !goAway {
		t.Fatal("the replaced listener's HTTP/2 connection got no GOAWAY")
	}
	if _, goAway := rb.until(t, drainIdleGrace+500*time.Millisecond, 0); goAway {
		t.Fatal("an HTTP/2 connection of the listener the update left alone got a GOAWAY")
	}
	rb.get(t, 3, bAddr, "/")
	if status, goAway := rb.until(t, 5*time.Second, 3); status != "200" || goAway {
		t.Fatalf("b's next stream after the change: status %q, GOAWAY %v", status, goAway)
	}
}

// TestUpdateListenersAdoptsUnused: a listener added at the address of an
// inherited socket nothing took (Unused) adopts it, with the connection
// queued in it; a listener removed and added again counts on in the same
// stats; a retired listener's connection count leaves the budget.
func TestUpdateListenersAdoptsUnused(t *testing.T) {
	if os.Getenv(ldsRebuildEnv) == "1" {
		t.Skip("UpdateListeners only")
	}
	lc := net.ListenConfig{Control: reusePortControl}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aAddr := ln.Addr().String()
	f, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	bAddr := fixedAddr(t)
	b := directListener("b", bAddr, "b")
	cfg := &config.Config{Listeners: []config.Listener{b}}
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Concurrency: 2, Logger: testLogger(), Inherited: map[SocketKey]*os.File{{Network: "tcp", Address: aAddr, Worker: -1}: f}}, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Start()
	// Queued in the inherited socket, which nobody accepts on yet.
	queued := dialTCP(t, aAddr)
	update := func(ls ...config.Listener) {
		t.Helper()
		cfg := &config.Config{Listeners: ls}
		cfg.SetDefaults()
		snap, err := BuildSnapshotN(cfg, Identity{Version: "test"}, 2)
		if err != nil {
			t.Fatal(err)
		}
		u, err := m.UpdateListeners(snap, UpdateOptions{HTTPTimeout: time.Second, ShutdownTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		<-u.Done()
	}
	a := directListener("a", aAddr, "a")
	update(b, a)
	if n := len(m.Unused()); n != 0 {
		t.Fatalf("%d inherited sockets left unused after a listener took their address", n)
	}
	io.WriteString(queued, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(queued), nil)
	if err != nil {
		t.Fatalf("the connection queued in the inherited socket: %v", err)
	}
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "a" {
		t.Fatalf("the connection queued in the inherited socket: %d %q", resp.StatusCode, body)
	}
	update(b)
	// Re-added (bound afresh: the adopted socket closed with the drain).
	update(b, a)
	if resp, body := get(t, newClient(t), "http://"+aAddr+"/"); resp.StatusCode != 200 || body != "a" {
		t.Fatalf("re-added listener: %d %q", resp.StatusCode, body)
	}
	if got := counter(m, "listener.a."+statRqTotal); got != 2 {
		t.Fatalf("listener.a.downstream_rq_total = %d, want 2: a re-added listener counts on", got)
	}
	if n := len(*m.budget.open.Load()); n != 2 {
		t.Fatalf("the budget counts %d listeners, want 2 (a and b): the removed instance's count stayed", n)
	}
}

// readAnswer reads one response from c: nil if it is a 200 whose body is
// want.
func readAnswer(c net.Conn, want string) error {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	if err == nil && (resp.StatusCode != 200 || string(body) != want) {
		err = fmt.Errorf("status %d %q", resp.StatusCode, body)
	}
	return err
}
