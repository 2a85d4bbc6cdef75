//go:build linux

package steering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireSteeringEnv makes requireSteering fail rather than skip when
// not root: set for the child of TestCapBPFIsEnough.
const requireSteeringEnv = "HOTPROXY_TEST_REQUIRE_STEERING"

// requireSteering skips when the process may not load BPF programs, and
// fails when it should be able to (root) but cannot.
func requireSteering(tb testing.TB) {
	tb.Helper()
	err := Probe()
	if err == nil {
		return
	}
	if os.Geteuid() != 0 && os.Getenv(requireSteeringEnv) == "" {
		tb.Skipf("not root, and the program does not load: %v", err)
	}
	tb.Fatalf("root, but the program does not load: %v", err)
}

// requireNoKernelMigration: the "problem" half of a test proves nothing
// if the kernel migrates queues on its own.
func requireNoKernelMigration(tb testing.TB) {
	tb.Helper()
	b, err := os.ReadFile(migrateSysctl)
	if err == nil && strings.TrimSpace(string(b)) != "0" {
		tb.Skipf("net.ipv4.tcp_migrate_req is on here: the kernel migrates without the program, the comparison proves nothing")
	}
}

// listenReusePort opens a SO_REUSEPORT listening socket on addr.
func listenReusePort(tb testing.TB, addr string) *net.TCPListener {
	tb.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	// Go listens with MPTCP by default where the kernel has it; the
	// socket array takes plain TCP sockets only.
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

func dial(tb testing.TB, addr string) *net.TCPConn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// queueInClosedSocket builds a group of two sockets with n connections
// queued (handshake done, never accepted) in the first, attaches the
// program when steer, closes the first, and returns the second socket
// and the clients.
func queueInClosedSocket(t *testing.T, n int, steer bool) (*net.TCPListener, []*net.TCPConn, *Group) {
	first := listenReusePort(t, "127.0.0.1:0")
	addr := first.Addr().String()
	var clients []*net.TCPConn
	for range n {
		// The first socket is alone in the group: every connection
		// queues in it.
		clients = append(clients, dial(t, addr))
	}
	second := listenReusePort(t, addr)
	var g *Group
	if steer {
		var err error
		if g, err = New(LeastConn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		if err := g.Attach([]syscall.Conn{first, second}); err != nil {
			t.Fatal(err)
		}
	}
	first.Close()
	return second, clients, g
}

// TestCloseResetsQueueWithoutProgram is the problem: closing a socket of a
// reuseport group resets every connection still queued in it, though
// another socket of the group is listening.
func TestCloseResetsQueueWithoutProgram(t *testing.T) {
	requireNoKernelMigration(t)
	const n = 8
	second, clients, _ := queueInClosedSocket(t, n, false)
	reset := 0
	for _, c := range clients {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) {
			reset++
		} else {
			t.Errorf("client %v: read: %v (want a reset)", c.LocalAddr(), err)
		}
	}
	second.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if c, err := second.Accept(); err == nil {
		c.Close()
		t.Errorf("the live socket got a connection of the closed one without the program")
	}
	t.Logf("without the program: %d of %d queued clients reset", reset, n)
}

// TestCloseMigratesQueueWithProgram is the cure: with the program, every
// connection queued in the closed socket is accepted by the live one and
// works.
func TestCloseMigratesQueueWithProgram(t *testing.T) {
	requireSteering(t)
	const n = 8
	second, clients, g := queueInClosedSocket(t, n, true)
	second.SetDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		c, err := second.Accept()
		if err != nil {
			t.Fatalf("accepted %d of %d on the live socket: %v", i, n, err)
		}
		defer c.Close()
		if _, err := c.Write([]byte{'x'}); err != nil {
			t.Fatalf("write to migrated connection %d: %v", i, err)
		}
	}
	for _, c := range clients {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
			t.Errorf("client %v: read %q, %v (want the server's byte)", c.LocalAddr(), b, err)
		}
	}
	if got := g.Migrated(); got != n {
		t.Errorf("Migrated() = %d, want %d", got, n)
	}
}

// spread opens 8 connections one after another on a group of 4 sockets
// and returns how many each socket accepted. With the group, the test
// plays the workers: +1 on the accepting socket's active count.
func spread(t *testing.T, g *Group) [4]int {
	const workers, conns = 4, 8
	first := listenReusePort(t, "127.0.0.1:0")
	addr := first.Addr().String()
	lns := []*net.TCPListener{first}
	for range workers - 1 {
		lns = append(lns, listenReusePort(t, addr))
	}
	if g != nil {
		sc := make([]syscall.Conn, len(lns))
		for i, l := range lns {
			sc[i] = l
		}
		if err := g.Attach(sc); err != nil {
			t.Fatal(err)
		}
	}
	accepted := make(chan int, conns)
	for i, l := range lns {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
				if g != nil {
					g.Active(i).Add(1)
				}
				accepted <- i
			}
		}()
	}
	var got [4]int
	for range conns {
		dial(t, addr)
		select {
		case i := <-accepted:
			got[i]++
		case <-time.After(5 * time.Second):
			t.Fatal("a connection was not accepted within 5s")
		}
	}
	return got
}

// TestLeastConnBalances: 4 workers, 8 long-lived connections opened one
// after another: least_conn gives every worker 2; the kernel's flow hash
// is reported for comparison.
func TestLeastConnBalances(t *testing.T) {
	requireSteering(t)
	g, err := New(LeastConn)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := spread(t, g)
	if got != [4]int{2, 2, 2, 2} {
		t.Errorf("least_conn spread %v, want [2 2 2 2]", got)
	}
	t.Logf("least_conn spread: %v; kernel (flow hash) spread: %v", got, spread(t, nil))
}

// TestHashIsStable: hash mode picks by flow hash among the live sockets;
// every connection lands on some socket and the program never drops one.
func TestHashMode(t *testing.T) {
	requireSteering(t)
	g, err := New(Hash)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := spread(t, g)
	if sum := got[0] + got[1] + got[2] + got[3]; sum != 8 {
		t.Errorf("hash spread %v accepted %d, want 8", got, sum)
	}
}

func TestDetachWithoutProgram(t *testing.T) {
	l := listenReusePort(t, "127.0.0.1:0")
	if err := Detach(l); err != nil {
		t.Errorf("Detach on a group with no program: %v", err)
	}
}

// TestCapBPFIsEnough: the program loads, steers and migrates in a process
// that is not root and holds CAP_BPF alone (what the systemd unit
// grants): the test binary re-executed as uid 65534 with CAP_BPF as an
// ambient capability.
func TestCapBPFIsEnough(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as uid 65534 with CAP_BPF")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hotproxy-capbpf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "steering.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []string{"TestCloseMigratesQueueWithProgram", "TestLeastConnBalances", "TestShedTogglesAndCounts"}
	// Bounded: a hung child is killed after a minute.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), requireSteeringEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
		AmbientCaps: []uintptr{unix.CAP_BPF},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid 65534 with CAP_BPF: %v\n%s", err, out)
	}
	for _, name := range tests {
		if !strings.Contains(string(out), "--- PASS: "+name) {
			t.Errorf("as uid 65534 with CAP_BPF, %s did not pass:\n%s", name, out)
		}
	}
}

// TestRefuseNewQueuesNothing: once RefuseNew is called, a new connection
// is refused at once and never enters the queue, so the close that
// follows has nothing to reset. Before it, a connection is queued as
// usual.
func TestRefuseNewQueuesNothing(t *testing.T) {
	requireSteering(t)
	ln := listenReusePort(t, "127.0.0.1:0")
	addr := ln.Addr().String()
	g, err := New(LeastConn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Attach([]syscall.Conn{ln}); err != nil {
		t.Fatal(err)
	}
	dial(t, addr) // steered and queued: the program lets connections in
	g.RefuseNew()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a connection completed its handshake after RefuseNew")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after RefuseNew: %v, want connection refused", err)
	}
	// Exactly the one connection from before RefuseNew is queued.
	queued := 0
	for {
		ln.SetDeadline(time.Now().Add(100 * time.Millisecond))
		c, err := ln.Accept()
		if err != nil {
			break
		}
		queued++
		c.Close()
	}
	if queued != 1 {
		t.Fatalf("%d connections queued, want the 1 from before RefuseNew", queued)
	}
}

// steeredOne is a group of one listening socket with the program
// attached.
func steeredOne(t *testing.T) (*net.TCPListener, string, *Group) {
	t.Helper()
	ln := listenReusePort(t, "127.0.0.1:0")
	g, err := New(LeastConn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Attach([]syscall.Conn{ln}); err != nil {
		t.Fatal(err)
	}
	return ln, ln.Addr().String(), g
}

// dialRefused dials addr and fails the test unless the kernel refuses it.
func dialRefused(t *testing.T, addr, when string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s: a connection completed its handshake", when)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s: dial: %v, want connection refused", when, err)
	}
}

// acceptOne dials addr and fails the test unless ln accepts it.
func acceptOne(t *testing.T, ln *net.TCPListener, addr, when string) {
	t.Helper()
	dial(t, addr)
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("%s: accept: %v, want the connection", when, err)
	}
	c.Close()
}

// TestShedTogglesAndCounts: Shed(true) refuses every new connection in
// the kernel and counts each; Shed(false) lets them in again; over many
// turns the count is exactly the dials refused, and no connection is
// queued while refusing.
func TestShedTogglesAndCounts(t *testing.T) {
	requireSteering(t)
	ln, addr, g := steeredOne(t)
	const turns, perTurn = 20, 3
	for turn := range turns {
		g.Shed(true)
		for range perTurn {
			dialRefused(t, addr, fmt.Sprintf("turn %d, shedding", turn))
		}
		g.Shed(false)
		acceptOne(t, ln, addr, fmt.Sprintf("turn %d, shed off", turn))
	}
	if got, want := g.ShedRefused(), uint64(turns*perTurn); got != want {
		t.Errorf("ShedRefused() = %d, want %d (the dials refused)", got, want)
	}
	if got := g.Refused(); got != 0 {
		t.Errorf("Refused() = %d, want 0: no RefuseNew", got)
	}
	ln.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Error("a connection refused while shedding was queued")
	}
}

// TestShedOffKeepsRefuseNew: a stopping generation (RefuseNew) stays
// closed when the overload manager's refusal ends; its drops count as its
// own, not as shed.
func TestShedOffKeepsRefuseNew(t *testing.T) {
	requireSteering(t)
	_, addr, g := steeredOne(t)
	g.Shed(true)
	dialRefused(t, addr, "shedding")
	g.RefuseNew()
	dialRefused(t, addr, "shedding and refusing new")
	g.Shed(false)
	dialRefused(t, addr, "refusing new, shed off")
	g.Shed(true)
	g.Shed(false)
	dialRefused(t, addr, "refusing new, shed turned on and off again")
	if got := g.ShedRefused(); got != 1 {
		t.Errorf("ShedRefused() = %d, want 1 (the dial before RefuseNew)", got)
	}
	if got := g.Refused(); got != 3 {
		t.Errorf("Refused() = %d, want 3 (the dials since RefuseNew)", got)
	}
}
