//go:build linux

package workers

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
			l := listenNoDelay(t, tc.listener)
			c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fd := rawAccept(t, listenerFile(t, l))
			defer unix.Close(fd)
			got, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
			if err != nil {
				t.Fatal(err)
			}
			if (got != 0) != (tc.want != 0) {
				t.Errorf("TCP_NODELAY on the accepted socket: %d, want %d", got, tc.want)
			}
		})
	}
}

// BenchmarkAcceptNet and BenchmarkAcceptRaw compare what a connection
// costs the accepting side through net (accept4, epoll_ctl ADD,
// getsockname, setsockopt TCP_NODELAY; epoll_ctl DEL and close) with a raw
// accept4 wrapped in an os.File (accept4, fcntl F_GETFL, epoll_ctl ADD;
// epoll_ctl DEL and close): the dial and the client's close are the same
// in both, so the difference is the accept path's (issue 22).
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
	lf := listenerFile(b, l)
	benchAccept(b, l, func() {
		f := os.NewFile(uintptr(rawAccept(b, lf)), "")
		f.Close()
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
