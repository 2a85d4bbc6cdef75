package workers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// handshakeLook is a way of looking for a port's request sockets.
type handshakeLook struct {
	name string
	look func(tb testing.TB, port int) bool
}

// handshakeLooks: the kernel's socket diagnostics (which must not fail
// here: a fallback taken in silence would hide it), the /proc fallback
// alone, and handshakesPending, which the drain calls.
var handshakeLooks = []handshakeLook{
	{"sock_diag", func(tb testing.TB, port int) bool {
		tb.Helper()
		pending := false
		for _, t := range tcpTables {
			p, err := sockDiagRequestSocket(t.family, port)
			if err != nil {
				tb.Fatalf("sock_diag %s: %v", t.name, err)
			}
			pending = pending || p
		}
		return pending
	}},
	{"proc", func(_ testing.TB, port int) bool {
		return procRequestSocket(tcpTables[0].procFile, port) || procRequestSocket(tcpTables[1].procFile, port)
	}},
	{"handshakesPending", func(_ testing.TB, port int) bool { return handshakesPending(port, testLogger()) }},
}

// deferringListener listens on ip:0 with TCP_DEFER_ACCEPT, so that a
// client that connects and sends nothing stays a request socket on the
// server's side.
func deferringListener(tb testing.TB, ip net.IP) *net.TCPListener {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	if err := setDeferAccept(ln, 30); err != nil {
		tb.Fatal(err)
	}
	return ln
}

func dialSilent(tb testing.TB, ln *net.TCPListener) net.Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func listenerPort(ln *net.TCPListener) int { return ln.Addr().(*net.TCPAddr).Port }

// TestHandshakesPendingLooks: every look sees a connection to a deferring
// socket whose client has sent nothing yet, for that port only, and no
// longer once its first bytes are in and it is accepted; on IPv4 and IPv6
// loopback.
func TestHandshakesPendingLooks(t *testing.T) {
	for _, fam := range []struct {
		name string
		ip   net.IP
	}{{"ipv4", net.IPv4(127, 0, 0, 1)}, {"ipv6", net.IPv6loopback}} {
		t.Run(fam.name, func(t *testing.T) {
			if fam.ip.To4() == nil {
				if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
					t.Skipf("no IPv6 loopback (::1) to listen on: %v", err)
				} else {
					ln.Close()
				}
			}
			looks := handshakeLooks
			ln := deferringListener(t, fam.ip)
			other := deferringListener(t, fam.ip)
			port, otherPort := listenerPort(ln), listenerPort(other)
			for _, l := range looks {
				if l.look(t, port) || l.look(t, otherPort) {
					t.Fatalf("%s: a connection is pending before any dial", l.name)
				}
			}

			// Another port's request socket is not this port's.
			dialSilent(t, other)
			for _, l := range looks {
				waitFor(t, 5*time.Second, l.name+" to see the other port's connection", func() bool { return l.look(t, otherPort) })
				if l.look(t, port) {
					t.Errorf("%s: port %d pending for a connection to port %d", l.name, port, otherPort)
				}
			}

			c := dialSilent(t, ln)
			for _, l := range looks {
				waitFor(t, 5*time.Second, l.name+" to see the silent client's connection", func() bool { return l.look(t, port) })
			}
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			ln.SetDeadline(time.Now().Add(5 * time.Second))
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			for _, l := range looks {
				if l.look(t, port) {
					t.Errorf("%s: still pending after it was accepted", l.name)
				}
				if !l.look(t, otherPort) {
					t.Errorf("%s: the other port's connection, still silent, is no longer seen", l.name)
				}
			}
		})
	}
}

// TestHandshakesPendingFallsBackToProc: where the kernel's socket
// diagnostics fail, the look reads /proc instead, still sees a pending
// connection, and says so once, at Debug.
func TestHandshakesPendingFallsBackToProc(t *testing.T) {
	refused := fmt.Errorf("sock_diag: netlink socket: %w", unix.EPROTONOSUPPORT)
	saved, savedFailed := sockDiagLook, sockDiagFailed.Load()
	sockDiagLook = func(uint8, int) (bool, error) { return false, refused }
	sockDiagFailed.Store(false)
	t.Cleanup(func() { sockDiagLook = saved; sockDiagFailed.Store(savedFailed) })
	var out bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &out})

	ln := deferringListener(t, net.IPv4(127, 0, 0, 1))
	port := listenerPort(ln)
	if handshakesPending(port, log) {
		t.Fatal("a connection is pending before any dial")
	}
	dialSilent(t, ln)
	waitFor(t, 5*time.Second, "the fallback to see the silent client's connection", func() bool { return handshakesPending(port, log) })
	handshakesPending(port, log)
	logged := out.String()
	if n := strings.Count(logged, "[DEBUG]"); n != 1 {
		t.Errorf("%d Debug lines, want one for the first failure:\n%s", n, logged)
	}
	if !strings.Contains(logged, "/proc/self/net/tcp") || !strings.Contains(logged, unix.EPROTONOSUPPORT.Error()) {
		t.Errorf("the log does not name the fallback and the error:\n%s", logged)
	}
}

// TestHandshakesPendingWithoutProc: where /proc is not mounted (a chroot,
// a container that hides it), a pending connection is still seen, as the
// kernel is asked. Before sock_diag the look read /proc only, so a drain
// found nothing there and reset such connections. The check runs in a
// child of the test binary with a mount namespace of its own.
func TestHandshakesPendingWithoutProc(t *testing.T) {
	if os.Getenv("HOTPROXY_TEST_NO_PROC") == "1" {
		handshakesWithoutProcChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) for a mount namespace to hide /proc in")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHandshakesPendingWithoutProc$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "HOTPROXY_TEST_NO_PROC=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes its mounts private
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child without /proc: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestHandshakesPendingWithoutProc")) {
		t.Fatalf("the child did not run the check:\n%s", out)
	}
}

func handshakesWithoutProcChild(t *testing.T) {
	if err := unix.Mount("tmpfs", "/proc", "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a tmpfs over /proc: %v", err)
	}
	if _, err := os.Stat(tcpTables[0].procFile); err == nil {
		t.Fatalf("%s is still there", tcpTables[0].procFile)
	}
	ln := deferringListener(t, net.IPv4(127, 0, 0, 1))
	port := listenerPort(ln)
	dialSilent(t, ln)
	waitFor(t, 5*time.Second, "the silent client's connection to be seen without /proc", func() bool { return handshakesPending(port, testLogger()) })
}

// nlMessage is a netlink message of type typ with body, padded.
func nlMessage(typ uint16, seq uint32, body []byte) []byte {
	n := unix.NLMSG_HDRLEN + len(body)
	m := make([]byte, (n+3)&^3)
	binary.NativeEndian.PutUint32(m[0:], uint32(n))
	binary.NativeEndian.PutUint16(m[4:], typ)
	binary.NativeEndian.PutUint32(m[8:], seq)
	copy(m[unix.NLMSG_HDRLEN:], body)
	return m
}

func diagMsg(family, state uint8, port uint16) []byte {
	b := make([]byte, sizeofInetDiagMsg)
	b[0], b[1] = family, state
	binary.BigEndian.PutUint16(b[4:], port)
	return b
}

func errBody(errno syscall.Errno) []byte {
	b := make([]byte, 4+unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(b, uint32(-int32(errno)))
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestParseSockDiagReply: what the reply parser makes of datagrams the
// kernel could send, and of ones it should not.
func TestParseSockDiagReply(t *testing.T) {
	const port = 8080
	done := nlMessage(unix.NLMSG_DONE, sockDiagSeq, make([]byte, 4))
	for _, tc := range []struct {
		name        string
		b           []byte
		found, done bool
		err         error // errors.Is; nil: none
		anyErr      bool
	}{
		{name: "only done", b: done, done: true},
		{name: "a match", b: cat(nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port)), done), found: true},
		{name: "a full SYN_RECV socket", b: nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpSynRecv, port)), found: true},
		{name: "a match after others", b: cat(
			nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port+1)),
			nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET6, tcpNewSynRecv, port)),
			nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, 1, port)),
			nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port))), found: true},
		{name: "others only, then more to come", b: nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port+1))},
		{name: "refused", b: nlMessage(unix.NLMSG_ERROR, sockDiagSeq, errBody(unix.ENOENT)), err: unix.ENOENT},
		{name: "dump ended in error", b: nlMessage(unix.NLMSG_DONE, sockDiagSeq, errBody(unix.EINTR)[:4]), err: unix.EINTR},
		{name: "another request's reply", b: nlMessage(unix.NLMSG_DONE, sockDiagSeq+1, nil), anyErr: true},
		{name: "short socket message", b: nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port)[:20]), anyErr: true},
		{name: "length past the datagram", b: nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, port))[:40], anyErr: true},
		{name: "half a header", b: done[:10], anyErr: true},
		{name: "zero length", b: make([]byte, unix.NLMSG_HDRLEN), anyErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found, done, err := parseSockDiagReply(tc.b, unix.AF_INET, port)
			switch {
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Errorf("error %v, want %v", err, tc.err)
			case tc.anyErr && err == nil:
				t.Error("no error")
			case tc.err == nil && !tc.anyErr && err != nil:
				t.Errorf("error %v", err)
			}
			if found != tc.found || done != tc.done {
				t.Errorf("found %v done %v, want %v %v", found, done, tc.found, tc.done)
			}
		})
	}
}

// FuzzParseSockDiagReply: no datagram makes the parser panic, or say
// both "found" and "done".
func FuzzParseSockDiagReply(f *testing.F) {
	f.Add(nlMessage(unix.NLMSG_DONE, sockDiagSeq, make([]byte, 4)))
	f.Add(cat(nlMessage(unix.SOCK_DIAG_BY_FAMILY, sockDiagSeq, diagMsg(unix.AF_INET, tcpNewSynRecv, 80)), nlMessage(unix.NLMSG_DONE, sockDiagSeq, nil)))
	f.Add(nlMessage(unix.NLMSG_ERROR, sockDiagSeq, errBody(unix.EPERM)))
	f.Fuzz(func(t *testing.T, b []byte) {
		found, done, err := parseSockDiagReply(b, unix.AF_INET, 80)
		if found && done {
			t.Error("found and done")
		}
		if err != nil && (found || done) {
			t.Errorf("an error (%v) with found %v done %v", err, found, done)
		}
	})
}

// BenchmarkHandshakesPending: one look for a port without request
// sockets (a drain's every look once its handshakes are done, and the
// whole table's walk either way) with benchConnPairs established loopback
// connections open in the namespace on top of whatever else it holds
// (reported as tcp-entries, the lines of /proc/self/net/tcp{,6}), and its
// CPU time as cpu-ns/op, which a busy machine does not inflate. The
// netlink look walks every bucket of the kernel's established hash (its
// size is net.ipv4.tcp_ehash_entries) once per family, whatever their
// number of sockets; the /proc one also formats and parses every socket.
//
//	go test -run '^$' -bench 'BenchmarkHandshakesPending/sock_diag' -benchtime 300x ./workers/
//	go test -run '^$' -bench 'BenchmarkHandshakesPending/proc' -benchtime 20x ./workers/
func BenchmarkHandshakesPending(b *testing.B) {
	const benchConnPairs = 4000
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	conns := make([]net.Conn, 0, 2*benchConnPairs)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	ln.SetDeadline(time.Now().Add(time.Minute))
	for range benchConnPairs {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			b.Fatalf("after %d connections: %v", len(conns)/2, err)
		}
		conns = append(conns, c)
		s, err := ln.Accept()
		if err != nil {
			b.Fatalf("after %d connections: %v", len(conns)/2, err)
		}
		conns = append(conns, s)
	}
	idle := deferringListener(b, net.IPv4(127, 0, 0, 1))
	port := listenerPort(idle)
	for _, l := range handshakeLooks[:2] {
		b.Run(l.name, func(b *testing.B) {
			// The machine may be busy: CPU time is the cost that counts,
			// the thread's own (the look's syscalls run on it).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			cpu0 := threadCPU(b)
			for b.Loop() {
				if l.look(b, port) {
					b.Fatal("a request socket on a port nobody dialled")
				}
			}
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(tcpEntries()), "tcp-entries")
		})
	}
}

// tcpEntries counts the namespace's TCP sockets, as /proc lists them.
func tcpEntries() int {
	n := 0
	for _, t := range tcpTables {
		if raw, err := os.ReadFile(t.procFile); err == nil {
			n += max(bytes.Count(raw, []byte("\n"))-1, 0)
		}
	}
	return n
}

// threadCPU is the calling thread's CPU time so far, user and system.
func threadCPU(tb testing.TB) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// TestSockDiagLookClosesItsSocket: a drain looks every handshakePoll, so
// a look that kept its netlink socket would run the process out of
// descriptors; each one, refused by the kernel or not, leaves none open.
func TestSockDiagLookClosesItsSocket(t *testing.T) {
	openFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	ln := deferringListener(t, net.IPv4(127, 0, 0, 1))
	dialSilent(t, ln)
	port := listenerPort(ln)
	waitFor(t, 5*time.Second, "the silent client's connection to be seen", func() bool { return handshakesPending(port, testLogger()) })
	before := openFDs()
	for range 200 {
		if _, err := sockDiagRequestSocket(unix.AF_INET, port); err != nil {
			t.Fatal(err)
		}
		if _, err := sockDiagRequestSocket(unix.AF_INET6, port); err != nil {
			t.Fatal(err)
		}
		if _, err := sockDiagRequestSocket(0xff, port); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("a dump of address family 255: %v, want the kernel's EINVAL", err)
		}
	}
	if after := openFDs(); after != before {
		t.Errorf("%d descriptors open after 600 looks, %d before", after, before)
	}
}
