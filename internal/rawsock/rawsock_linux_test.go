//go:build linux

package rawsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen returns a TCP listener on addr and its Listener, both closed
// at the end of the test.
func listen(tb testing.TB, lc net.ListenConfig, addr string) (*net.TCPListener, *Listener) {
	tb.Helper()
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	l, err := Listen(ln.(*net.TCPListener))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return ln.(*net.TCPListener), l
}

// pair returns a client connection and the Conn accepted for it.
func pair(tb testing.TB, ln *net.TCPListener, l *Listener) (client net.Conn, c *Conn) {
	tb.Helper()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	l.SetDeadline(time.Now().Add(10 * time.Second))
	c, err = l.NewAcceptor().Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return client, c
}

func sockoptInt(tb testing.TB, c *Conn, level, opt int) int {
	tb.Helper()
	var v int
	var gerr error
	if err := c.withFD(func(fd int) error { v, gerr = unix.GetsockoptInt(fd, level, opt); return nil }); err != nil {
		tb.Fatal(err)
	}
	if gerr != nil {
		tb.Fatal(gerr)
	}
	return v
}

// The saving rests on the kernel copying the listening socket's
// TCP_NODELAY into each socket it accepts: without it every response
// could wait on Nagle's algorithm for the client's delayed ACK.
func TestNoDelayInheritedFromListener(t *testing.T) {
	for _, mptcp := range []bool{false, true} {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		ln, l := listen(t, lc, "127.0.0.1:0")
		_, c := pair(t, ln, l)
		if l.noDelayEach {
			t.Logf("mptcp %v: the listening socket refused TCP_NODELAY; each accepted socket sets it", mptcp)
		}
		if v := sockoptInt(t, c, unix.IPPROTO_TCP, unix.TCP_NODELAY); v == 0 {
			t.Errorf("mptcp %v: accepted socket has TCP_NODELAY off", mptcp)
		}
	}
}

// A connection whose request is in and whose response fits the send
// buffer never joins the poller: read, write and close on the bare
// descriptor.
func TestExchangeWithoutPoller(t *testing.T) {
	// TCP_DEFER_ACCEPT, as the HTTP listeners have it: accept returns
	// the connection once its first bytes are in.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1) })
		return serr
	}}
	ln, l := listen(t, lc, "127.0.0.1:0")
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	l.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := l.NewAcceptor().Accept()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if _, err := c.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if c.file.Load() != nil {
		t.Error("the Conn registered in the poller though nothing had to wait")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "pong" {
		t.Fatalf("client read %q, %v; want pong then EOF", got, err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close = %v, want net.ErrClosed", err)
	}
	if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %v, want net.ErrClosed", err)
	}
}

// A read with nothing to read registers and waits: for bytes, and
// within a deadline set before the registration.
func TestReadWaitsOnceNothingIsThere(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, c := pair(t, ln, l)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	buf := make([]byte, 8)
	_, err := c.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline = %v, want a timeout", err)
	}
	if c.file.Load() == nil {
		t.Fatal("a read that had to wait did not register")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	go client.Write([]byte("late"))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "late" {
		t.Fatalf("Read = %q, %v; want late", buf[:n], err)
	}
	client.Close()
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("Read at the client's close = %v, want io.EOF", err)
	}
}

// Close wakes a read waiting in the poller, with net.ErrClosed.
func TestCloseWakesWaitingRead(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	_, c := pair(t, ln, l)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 8))
		done <- err
	}()
	// Close only once the read waits in the poller (it registered).
	for i := 0; c.file.Load() == nil && i < 10000; i++ {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	wantClosed(t, done, "the waiting Read")
}

// wantClosed waits, bounded, for what a Close should have woken (done
// delivers its error) and checks that it says net.ErrClosed.
func wantClosed(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("%s after Close = %v, want net.ErrClosed", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Close did not wake %s", what)
	}
}

// Close from another goroutine while a raw operation holds the
// unregistered descriptor leaves the descriptor open until it returns:
// its number cannot go to another socket under it.
func TestCloseWaitsForRawHolder(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	_, c := pair(t, ln, l)
	fd := c.fd
	rc, _ := c.SyscallConn()
	var during error
	rc.Control(func(uintptr) {
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		<-closed
		_, during = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	})
	if during != nil {
		t.Fatalf("the descriptor was closed under a raw holder: %v", during)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("after the holder returned, fcntl = %v; want EBADF (closed)", err)
	}
	if err := rc.Control(func(uintptr) {}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Control after Close = %v, want net.ErrClosed", err)
	}
}

// A RawConn callback that must wait makes the Conn register, is called
// again, then woken by readiness.
func TestRawReadRegistersAndWaits(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, c := pair(t, ln, l)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rc, _ := c.SyscallConn()
	calls := 0
	var got []byte
	go func() {
		// Write once the read waits in the poller (bounded: past 10s
		// the read's deadline fails the test anyway).
		for i := 0; c.file.Load() == nil && i < 10000; i++ {
			time.Sleep(time.Millisecond)
		}
		client.Write([]byte("x"))
	}()
	err := rc.Read(func(fd uintptr) bool {
		calls++
		b := make([]byte, 4)
		n, err := unix.Read(int(fd), b)
		if err == unix.EAGAIN {
			return false
		}
		got = b[:max(n, 0)]
		return true
	})
	if err != nil || string(got) != "x" {
		t.Fatalf("RawConn.Read = %q, %v", got, err)
	}
	if calls < 2 {
		t.Fatalf("callback called %d times, want the raw try and a call after the wait", calls)
	}
}

// A registered Conn reads and writes through the poller's waits but
// with its own calls: a Write larger than the send buffer waits for
// room and writes all of it, a Read gets what the client sent, and
// neither allocates.
func TestRegisteredReadAndWrite(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, c := pair(t, ln, l)
	if err := c.Register(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	client.SetDeadline(time.Now().Add(10 * time.Second))

	big := make([]byte, 8<<20) // far more than a loopback send buffer
	for i := range big {
		big[i] = byte(i)
	}
	wrote := make(chan error, 1)
	go func() {
		n, err := c.Write(big)
		if err == nil && n != len(big) {
			err = fmt.Errorf("Write = %d of %d bytes, no error", n, len(big))
		}
		wrote <- err
	}()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatalf("the client's read of the big write: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the client read other bytes than the Conn wrote")
	}

	msg, buf, back := []byte("ping"), make([]byte, 16), make([]byte, 16)
	allocs := testing.AllocsPerRun(100, func() {
		client.Write(msg)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
			t.Fatalf("Read = %q, %v; want ping", buf[:n], err)
		}
		c.Write(buf[:4])
		if _, err := io.ReadFull(client, back[:4]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per registered Read and Write, want 0", allocs)
	}

	// A reset client: the write fails, named as a write.
	client.(*net.TCPConn).SetLinger(0)
	client.Close()
	var err error
	for range 100 { // the reset may need a first write to show
		if _, err = c.Write(msg); err != nil {
			break
		}
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" ||
		!(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		t.Fatalf("Write to a reset client = %v, want a write's ECONNRESET or EPIPE", err)
	}
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct{ listen, dial string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{":0", "127.0.0.1"},
		{"[::1]:0", "::1"},
	} {
		addr := tc.listen
		if tc.dial == "::1" {
			if probe, err := net.Listen("tcp6", "[::1]:0"); err != nil {
				t.Logf("no IPv6 loopback here (%v): the IPv6 case is not run", err)
				continue
			} else {
				probe.Close()
			}
		}
		ln, l := listen(t, net.ListenConfig{}, addr)
		port := ln.Addr().(*net.TCPAddr).Port
		client, err := net.Dial("tcp", net.JoinHostPort(tc.dial, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		l.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := l.NewAcceptor().Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, want := c.RemoteAddr().String(), client.LocalAddr().String(); got != want {
			t.Errorf("%s: RemoteAddr = %s, want %s", addr, got, want)
		}
		ap := c.RemoteAddrPort()
		if got, want := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), client.LocalAddr().String(); got != want {
			t.Errorf("%s: RemoteAddrPort = %s, want %s", addr, got, want)
		}
		// A wildcard listener's connections look theirs up.
		if got, want := c.LocalAddr().String(), client.RemoteAddr().String(); got != want {
			t.Errorf("%s: LocalAddr = %s, want %s", addr, got, want)
		}
	}
}

// Accept honours the Listener's deadline and Close as net's does.
func TestAcceptDeadlineAndClose(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	a := l.NewAcceptor()
	if c := a.AcceptQueued(); c != nil {
		t.Fatal("AcceptQueued with nothing queued returned a connection")
	}
	l.SetDeadline(time.Now().Add(-time.Second))
	_, err := a.Accept()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Accept past the deadline = %v, want a timeout", err)
	}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Queued: the handshake completed in the kernel before Dial returned.
	c := a.AcceptQueued()
	if c == nil {
		t.Fatal("AcceptQueued did not take the queued connection")
	}
	c.Close()
	l.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() { _, err := a.Accept(); done <- err }()
	time.Sleep(20 * time.Millisecond) // let it wait; the close must wake it either way
	l.Close()
	wantClosed(t, done, "Accept")
}

// An out-of-descriptors accept reports EMFILE as net's does, so that the
// caller's shedding sees it.
func TestAcceptOutOfDescriptors(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Fill the table up to a low soft limit with dups, then accept.
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}()
	low := lim
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	for range 256 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		held = append(held, fd)
	}
	l.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = l.NewAcceptor().Accept()
	if !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("Accept with no descriptor left = %v, want EMFILE", err)
	}
}

// NetConn gives a tunnel a *net.TCPConn on the same socket, closed with
// the Conn.
func TestNetConnForTunnels(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, c := pair(t, ln, l)
	tc, err := c.NetConn()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Write([]byte("via dup")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := client.Read(buf)
	if err != nil || string(buf[:n]) != "via dup" {
		t.Fatalf("client read %q, %v", buf[:n], err)
	}
	c.Close()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(buf); err != io.EOF {
		t.Fatalf("after the Conn's Close the client read %q, %v; want EOF (the dup closed too)", buf[:n], err)
	}
	if _, err := tc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the dup after Close: Write = %v, want net.ErrClosed", err)
	}
}

// CloseWrite sends the FIN; SetLinger(0) makes Close a reset.
func TestCloseWriteAndLinger(t *testing.T) {
	ln, l := listen(t, net.ListenConfig{}, "127.0.0.1:0")
	client, c := pair(t, ln, l)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after CloseWrite the client read %v, want EOF", err)
	}
	client2, c2 := pair(t, ln, l)
	if err := c2.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	client2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := client2.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after SetLinger(0) and Close the client read %v, want ECONNRESET", err)
	}
}
