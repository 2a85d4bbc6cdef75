package hotrestart

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// When the test binary is re-executed as another user, it plays a child
// that tries to take over, and reports what it was told on stdout.
// With childTimesEnv it tries that many times, one connection after the
// other, and reports how many were refused.
const (
	childAddrEnv  = "HOTRESTART_TEST_DIAL"
	childTimesEnv = "HOTRESTART_TEST_DIAL_TIMES"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(squatAddrEnv); addr != "" {
		os.Exit(squat(addr))
	}
	if addr := os.Getenv(childAddrEnv); addr != "" {
		times, _ := strconv.Atoi(os.Getenv(childTimesEnv))
		if times <= 1 {
			_, err := Dial(addr, Identity{Epoch: 1}, 5*time.Second)
			fmt.Println(err)
			os.Exit(0)
		}
		refused := 0
		for i := 0; i < times; i++ {
			ch, err := Dial(addr, Identity{Epoch: 1}, 5*time.Second)
			if errors.Is(err, ErrRefused) {
				refused++
			} else if err == nil {
				ch.Close()
			}
		}
		fmt.Printf("refused %d of %d\n", refused, times)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var addrSeq atomic.Int64

func testAddr() string {
	return fmt.Sprintf("@hotproxy-test.%d.%d", os.Getpid(), addrSeq.Add(1))
}

// recorder is a Handler that hands over real listening sockets and records
// what the protocol told it.
type recorder struct {
	listeners []*net.TCPListener
	mu        sync.Mutex
	drains    []Identity
	unused    [][]Socket // per drain
	lost      chan lostEvent
}

type lostEvent struct {
	child   Identity
	drained bool
	err     error
}

func newRecorder(tb testing.TB, n int) *recorder {
	tb.Helper()
	r := &recorder{lost: make(chan lostEvent, 16)}
	for i := 0; i < n; i++ {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { ln.Close() })
		r.listeners = append(r.listeners, ln)
	}
	return r
}

func (r *recorder) Sockets() ([]Socket, []*os.File, error) {
	var sockets []Socket
	var files []*os.File
	for i, ln := range r.listeners {
		f, err := ln.File()
		if err != nil {
			CloseFiles(files)
			return nil, nil, err
		}
		sockets = append(sockets, Socket{Network: "tcp", Address: ln.Addr().String(), Worker: i, Role: RoleListener, Name: "l"})
		files = append(files, f)
	}
	return sockets, files, nil
}

func (r *recorder) Drain(child Identity, unused []Socket) {
	r.mu.Lock()
	r.drains = append(r.drains, child)
	r.unused = append(r.unused, unused)
	r.mu.Unlock()
}

func (r *recorder) ChildLost(child Identity, drained bool, err error) {
	r.lost <- lostEvent{child, drained, err}
}

func startParent(tb testing.TB, h Handler, opts ParentOptions) *Parent {
	tb.Helper()
	if opts.Address == "" {
		opts.Address = testAddr()
	}
	opts.Handler = h
	if opts.Self.PID == 0 {
		opts.Self = Identity{PID: os.Getpid(), Epoch: 0, BinaryVersion: "test", FirstStart: 42}
	}
	p, err := Listen(opts)
	if err != nil {
		tb.Fatalf("Listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve() }()
	tb.Cleanup(func() {
		p.Close()
		if err := <-done; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	return p
}

// openSockets counts this process's socket descriptors by target
// ("socket:[inode]"), a dup counting once more. The hand-over creates
// descriptors of no other kind; files the runtime or the test framework
// open and close meanwhile (a /proc read, a pidfd) are not its doing.
func openSockets(tb testing.TB) map[string]int {
	tb.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	sockets := map[string]int{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		if strings.HasPrefix(target, "socket:") {
			sockets[target]++
		}
	}
	return sockets
}

func TestHandOverSocketsInBatches(t *testing.T) {
	// More sockets than fit in one message, so batching is exercised.
	const n = 2*maxFilesPerMessage + 5
	r := newRecorder(t, n)
	p := startParent(t, r, ParentOptions{})

	ch, err := Dial(p.Addr(), Identity{Epoch: 1, BinaryVersion: "next"}, 0)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer ch.Close()
	if got := ch.Parent(); got.FirstStart != 42 || got.BinaryVersion != "test" {
		t.Fatalf("parent identity: %+v", got)
	}
	sockets, files, err := ch.Sockets()
	if err != nil {
		t.Fatalf("Sockets: %v", err)
	}
	defer CloseFiles(files)
	if len(sockets) != n || len(files) != n {
		t.Fatalf("got %d sockets and %d files, want %d", len(sockets), len(files), n)
	}
	for i, s := range sockets {
		if s.Worker != i || s.Address != r.listeners[i].Addr().String() {
			t.Fatalf("socket %d: %+v, want worker %d address %s", i, s, i, r.listeners[i].Addr())
		}
	}
	// Handing a socket over must not change the parent's own listener:
	// O_NONBLOCK is shared by every descriptor of the socket, and a
	// blocking listener no longer wakes up for its deadlines (drain).
	for i, ln := range r.listeners {
		raw, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		raw.Control(func(fd uintptr) { flags, err = unix.FcntlInt(fd, unix.F_GETFL, 0) })
		if err != nil || flags&unix.O_NONBLOCK == 0 {
			t.Fatalf("listener %d after the hand-over: flags %#x, err %v: O_NONBLOCK lost", i, flags, err)
		}
	}

	// The received fd is the very socket the parent listens on: a client
	// that connects to its address is accepted through it.
	ln, err := net.FileListener(files[n-1])
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", sockets[n-1].Address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept on the handed-over socket: %v", err)
	}
	conn.Close()

	if err := ch.Drain(nil); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	r.mu.Lock()
	drains := len(r.drains)
	childPID := r.drains[0].PID
	r.mu.Unlock()
	if drains != 1 || childPID != os.Getpid() {
		t.Fatalf("drains %d, child pid %d (want 1, %d from SO_PEERCRED)", drains, childPID, os.Getpid())
	}

	ch.Close()
	select {
	case ev := <-r.lost:
		if !ev.drained || ev.err != nil {
			t.Fatalf("ChildLost after a clean close: %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ChildLost not called after the child closed")
	}
}

func TestChildDyingBeforeDrainIsReported(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, files, err := ch.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(files)
	ch.Close()
	select {
	case ev := <-r.lost:
		if ev.drained {
			t.Fatalf("reported drained for a child that never asked: %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ChildLost not called")
	}
	// Nothing is stuck: the next child takes over.
	ch2, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatalf("second attempt after a dead child: %v", err)
	}
	defer ch2.Close()
	if err := ch2.Drain(nil); err != nil {
		t.Fatal(err)
	}
}

func TestSecondChildIsRefusedWhileOneTakesOver(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	first, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already taking over") {
		t.Fatalf("second child: %v, want a refusal saying another is taking over", err)
	}
	if p.Refused() != 1 {
		t.Fatalf("refused count %d, want 1", p.Refused())
	}
	// The first one is unaffected.
	if _, files, err := first.Sockets(); err != nil {
		t.Fatalf("first child after the race: %v", err)
	} else {
		CloseFiles(files)
	}
}

// rawDial connects without speaking the protocol.
func rawDial(tb testing.TB, addr string) *net.UnixConn {
	tb.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// readReply reads the parent's answer and then expects the connection to
// be closed.
func readReply(tb testing.TB, c *net.UnixConn) string {
	tb.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, maxMessageBytes)
	n, err := c.Read(buf)
	if err != nil {
		tb.Fatalf("reading the reply: %v", err)
	}
	reply := string(buf[:n])
	if n, err := c.Read(buf); err == nil && n > 0 {
		tb.Fatalf("connection still open after the refusal; read %q", buf[:n])
	}
	return reply
}

func TestGarbageIsRefusedAndParentServesOn(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Timeout: time.Second})
	cases := map[string][]byte{
		"not json":       []byte("\x00\xffgarbage"),
		"unknown type":   []byte(`{"type":"rm -rf"}`),
		"unknown field":  []byte(`{"type":"hello","version":"1.0","identity":{},"evil":1}`),
		"no identity":    []byte(`{"type":"hello","version":"1.0"}`),
		"drain first":    []byte(`{"type":"drain"}`),
		"trailing bytes": []byte(`{"type":"hello","version":"1.0","identity":{}} {}`),
		"too large":      []byte(`{"type":"hello","version":"1.0","identity":{"binary_version":"` + strings.Repeat("x", maxMessageBytes) + `"}}`),
	}
	for name, payload := range cases {
		t.Run(name, func(t *testing.T) {
			c := rawDial(t, p.Addr())
			if _, err := c.Write(payload); err != nil {
				t.Fatal(err)
			}
			reply := readReply(t, c)
			if !strings.Contains(reply, `"type":"error"`) {
				t.Fatalf("reply %q is not an error message", reply)
			}
		})
	}
	t.Run("silent peer", func(t *testing.T) {
		c := rawDial(t, p.Addr())
		if reply := readReply(t, c); !strings.Contains(reply, "expected hello") {
			t.Fatalf("reply to silence: %q", reply)
		}
	})
	if got := p.Refused(); got != uint64(len(cases)+1) {
		t.Errorf("refused %d peers, want %d", got, len(cases)+1)
	}
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatalf("a real child after the garbage: %v", err)
	}
	ch.Close()
}

func TestIncompatibleVersionSaysWhatToDo(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	c := rawDial(t, p.Addr())
	c.Write([]byte(`{"type":"hello","version":"2.0","identity":{"pid":1,"epoch":1,"binary_version":"future"}}`))
	reply := readReply(t, c)
	for _, want := range []string{"incompatible", "2.0", "start the new binary cold"} {
		if !strings.Contains(reply, want) {
			t.Errorf("reply %q does not say %q", reply, want)
		}
	}
	if compatible("1.7") != nil {
		t.Error("a newer minor version must be compatible")
	}
}

func TestAbstractAddressInUse(t *testing.T) {
	p := startParent(t, newRecorder(t, 1), ParentOptions{})
	if _, err := Listen(ParentOptions{Address: p.Addr(), Handler: newRecorder(t, 1)}); !errors.Is(err, ErrGenerationRunning) {
		t.Fatalf("second Listen on a live abstract socket: %v, want ErrGenerationRunning", err)
	}
}

func TestNoParent(t *testing.T) {
	_, err := Dial(testAddr(), Identity{Epoch: 1}, time.Second)
	if !errors.Is(err, ErrNoParent) {
		t.Fatalf("Dial with nobody listening: %v, want ErrNoParent", err)
	}
}

func TestFilesystemSocketIsPrivateAndStaleOneReplaced(t *testing.T) {
	dir := t.TempDir()
	addr := Address(7, 3, dir)
	if addr != filepath.Join(dir, "hotproxy.7.3.sock") {
		t.Fatalf("Address: %s", addr)
	}
	// A stale socket file, as a killed generation leaves it.
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Address: addr})
	fi, err := os.Stat(addr)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Fatalf("restart socket mode %o, want 600", mode)
	}
	if _, err := Listen(ParentOptions{Address: addr, Handler: r}); !errors.Is(err, ErrGenerationRunning) {
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	ch, err := Dial(addr, Identity{Epoch: 4}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	p.Close()
	if _, err := os.Stat(addr); !os.IsNotExist(err) {
		t.Fatalf("socket file left behind after Close: %v", err)
	}
}

func TestOtherUserIsRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a peer as another uid (nobody)")
	}
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	exe := copyExecutableForAnyone(t)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childAddrEnv+"="+p.Addr())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("peer as nobody: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "uid 65534") || !strings.Contains(string(out), "refused") {
		t.Fatalf("peer as nobody was told %q, want a refusal naming its uid", out)
	}
	if p.Refused() != 1 {
		t.Fatalf("refused count %d, want 1", p.Refused())
	}
	select {
	case ev := <-r.lost:
		t.Fatalf("a refused peer reached the handler: %+v", ev)
	default:
	}
}

// lockedBuffer is a log destination that sessions write to concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestForeignUIDFloodIsRateLimited: another user hammering the restart
// socket is refused every time and counted every time, but the log gets a
// line per interval, not one per connection; and a refusal of another
// kind right after the flood is still logged.
func TestForeignUIDFloodIsRateLimited(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a peer as another uid (nobody)")
	}
	const flood = 200
	var logged lockedBuffer
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Logger: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})})
	exe := copyExecutableForAnyone(t)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childAddrEnv+"="+p.Addr(), fmt.Sprintf("%s=%d", childTimesEnv, flood))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("peer as nobody: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("refused %d of %d", flood, flood); !strings.Contains(string(out), want) {
		t.Fatalf("peer as nobody says %q, want %q", out, want)
	}
	if got := p.Refused(); got != flood {
		t.Errorf("refused count %d, want %d", got, flood)
	}
	lines := strings.Count(logged.String(), "peer runs as uid 65534")
	if lines < 1 || lines > 3 {
		t.Errorf("%d log lines for %d refusals of uid 65534, want 1 to 3:\n%s", lines, flood, logged.String())
	}
	// Garbage from a permitted peer is another kind: its first refusal
	// is logged although the stranger's limiter is holding lines back.
	c := rawDial(t, p.Addr())
	c.Write([]byte("garbage"))
	readReply(t, c)
	waitNoSessions(t, p)
	if !strings.Contains(logged.String(), "refused a peer on the restart socket: expected hello") {
		t.Errorf("the refusal of a garbage peer after the flood was not logged:\n%s", logged.String())
	}
	if got := p.Refused(); got != flood+1 {
		t.Errorf("refused count %d, want %d", got, flood+1)
	}
}

func TestNoFDLeakAcrossHandOvers(t *testing.T) {
	r := newRecorder(t, 4)
	p := startParent(t, r, ParentOptions{})
	handOver := func() {
		ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, files, err := ch.Sockets()
		if err != nil {
			t.Fatal(err)
		}
		CloseFiles(files)
		if err := ch.Drain(nil); err != nil {
			t.Fatal(err)
		}
		ch.Close()
		select {
		case <-r.lost:
		case <-time.After(5 * time.Second):
			t.Fatal("session did not end")
		}
	}
	handOver() // warm up lazily opened fds (epoll)
	waitNoSessions(t, p)
	before := openSockets(t)
	for i := 0; i < 30; i++ {
		handOver()
	}
	waitNoSessions(t, p)
	// A leak is a socket descriptor gained: a socket not open before, or
	// one more dup of one that was. One that went away is not this
	// test's business (and not a leak).
	after := openSockets(t)
	for target, n := range after {
		if n > before[target] {
			t.Errorf("%s: %d descriptors after 30 hand-overs, %d before", target, n, before[target])
		}
	}
	if t.Failed() {
		t.Logf("socket descriptors before: %v, after: %v", before, after)
	}
}

// copyExecutableForAnyone copies the test binary where another uid can run
// it: go test builds it in a directory only its owner may enter.
func copyExecutableForAnyone(tb testing.TB) string {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hotrestart-peer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	exe := filepath.Join(dir, "peer.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		tb.Fatal(err)
	}
	return exe
}

// waitNoSessions waits until every session has closed its connection. A
// session leaves p.conns only once its connection is closed; it reports a
// lost child before that, so a test that saw ChildLost must still wait.
func waitNoSessions(tb testing.TB, p *Parent) {
	tb.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			return
		}
	}
	tb.Fatal("sessions still open after 5s")
}

// TestSupervisedGenerationRefusesAStranger: a generation that runs under a
// supervisor hands over to a child of that supervisor, or to one that
// says it runs under a supervisor of its own, and refuses anything else
// with what to do instead.
func TestSupervisedGenerationRefusesAStranger(t *testing.T) {
	t.Run("not the supervisor's child", func(t *testing.T) {
		// This process is not its own parent: as a child, it was not
		// started by "supervisor" os.Getpid().
		sup := os.Getpid()
		r := newRecorder(t, 1)
		p := startParent(t, r, ParentOptions{Supervisor: sup})
		_, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("Dial: %v, want a refusal", err)
		}
		for _, want := range []string{fmt.Sprintf("supervisor (pid %d)", sup), "unsupervised", "hotproxy reload", fmt.Sprintf("kill -HUP %d", sup)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		}
		if p.Refused() != 1 {
			t.Errorf("refused count %d, want 1", p.Refused())
		}
		// One that runs under a supervisor of its own is let in.
		ch, err := Dial(p.Addr(), Identity{Epoch: 1, Features: []string{FeatureSupervised}}, 0)
		if err != nil {
			t.Fatalf("a child under another supervisor: %v", err)
		}
		ch.Close()
	})
	t.Run("the supervisor's child", func(t *testing.T) {
		// The kernel says this process's parent is os.Getppid().
		r := newRecorder(t, 1)
		p := startParent(t, r, ParentOptions{Supervisor: os.Getppid()})
		ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
		if err != nil {
			t.Fatalf("the supervisor's own child: %v", err)
		}
		ch.Close()
	})
}

// TestParentPID reads the parent pid past a command name that holds
// spaces and parentheses.
func TestParentPID(t *testing.T) {
	if got, err := parentPID(os.Getpid()); err != nil || got != os.Getppid() {
		t.Fatalf("parentPID(self) = %d, %v; want %d", got, err, os.Getppid())
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	odd := filepath.Join(t.TempDir(), "a) 1 (b")
	if err := os.Symlink(sleep, odd); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if got, err := parentPID(cmd.Process.Pid); err != nil || got != os.Getpid() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		t.Fatalf("parentPID(%q) = %d, %v; want %d\n%s", odd, got, err, os.Getpid(), b)
	}
}

// TestUnusedSocketsReachTheParent: the child lists the sockets it did not
// take in its drain message, and the parent's handler gets them.
func TestUnusedSocketsReachTheParent(t *testing.T) {
	r := newRecorder(t, 2)
	p := startParent(t, r, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if !slices.Contains(ch.Parent().Features, FeatureUnusedSockets) {
		t.Fatalf("parent features %v lack %q", ch.Parent().Features, FeatureUnusedSockets)
	}
	sockets, files, err := ch.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(files)
	if err := ch.Drain(sockets[1:]); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.unused) != 1 || len(r.unused[0]) != 1 || r.unused[0][0] != sockets[1] {
		t.Fatalf("the handler was told %v unused, want [[%v]]", r.unused, sockets[1])
	}
}

// TestUnusedSocketsNotSentToAnOlderParent: a parent that does not list
// FeatureUnusedSockets (protocol 1.0) refuses a message with a field it
// does not know; the child must send it a plain drain.
func TestUnusedSocketsNotSentToAnOlderParent(t *testing.T) {
	addr := testAddr()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		uc, err := ln.AcceptUnix()
		if err != nil {
			got <- err.Error()
			return
		}
		defer uc.Close()
		uc.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, maxMessageBytes)
		if _, err := uc.Read(buf); err != nil { // hello
			got <- err.Error()
			return
		}
		uc.Write([]byte(`{"type":"hello","version":"1.0","identity":{"pid":1,"epoch":0,"binary_version":"old"}}`))
		n, err := uc.Read(buf) // drain
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
		uc.Write([]byte(`{"type":"ok"}`))
	}()
	ch, err := Dial(addr, Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Drain([]Socket{{Network: "tcp", Address: "127.0.0.1:1", Role: RoleListener}}); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if m := <-got; m != `{"type":"drain"}` {
		t.Fatalf("an older parent was sent %s, want a plain drain", m)
	}
}
