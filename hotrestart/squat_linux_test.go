package hotrestart

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// A squatter is the test binary re-executed as uid 65534 (nobody): a
// fake parent that binds a restart socket first and speaks the protocol
// for real, offering its own listening socket and session-ticket key. It
// says "listening" on stdout once bound, and every request it answers
// ("gave sockets", "gave ticket keys", "told to drain"); it stops when its
// stdin closes.
const squatAddrEnv = "HOTRESTART_TEST_SQUAT"

// squatSilentEnv ("1") makes the squatter bind the name without
// listening: connecting to it is refused, so the kernel cannot say who
// holds it.
const squatSilentEnv = "HOTRESTART_TEST_SQUAT_SILENT"

func squat(addr string) int {
	if os.Getenv(squatSilentEnv) == "1" {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrUnix{Name: addr})
		}
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		fmt.Println("listening")
		io.Copy(io.Discard, os.Stdin)
		unix.Close(fd)
		return 0
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	p, err := Listen(ParentOptions{
		Address: addr,
		Self:    Identity{PID: os.Getpid(), BinaryVersion: "squatter"},
		Handler: squatHandler{ln},
		Logger:  hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Info}),
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	go p.Serve()
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	p.Close()
	return 0
}

type squatHandler struct{ ln *net.TCPListener }

func (h squatHandler) Sockets() ([]Socket, []*os.File, error) {
	fmt.Println("gave sockets")
	f, err := h.ln.File()
	if err != nil {
		return nil, nil, err
	}
	return []Socket{{Network: "tcp", Address: h.ln.Addr().String(), Worker: 0, Role: RoleListener}}, []*os.File{f}, nil
}

func (h squatHandler) SessionTicketKeys() []ListenerTicketKeys {
	fmt.Println("gave ticket keys")
	return []ListenerTicketKeys{{Listener: "web", Keys: []TicketKey{{Key: make([]byte, TicketKeySize), Created: 1}}}}
}

func (squatHandler) Drain(Identity, []Socket)        { fmt.Println("told to drain") }
func (squatHandler) ChildLost(Identity, bool, error) {}

var _ TicketKeySource = squatHandler{}

// squatter is a running squatter.
type squatter struct {
	pid    int
	stdout *lockedBuffer
	stderr *lockedBuffer
}

// startSquatter runs a squatter as nobody on addr and waits until it is
// bound.
func startSquatter(tb testing.TB, addr string, env ...string) *squatter {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to run a fake parent as another uid (nobody)")
	}
	cmd := exec.Command(copyExecutableForAnyone(tb), "-test.run=^$")
	cmd.Env = append(append(os.Environ(), squatAddrEnv+"="+addr), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	sq := &squatter{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}}
	cmd.Stderr = sq.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	sq.pid = cmd.Process.Pid
	tb.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			// Kept before it is announced: a test that read stdout
			// right after the first line could find it empty.
			sq.stdout.Write([]byte(line + "\n"))
			select {
			case first <- line:
			default:
			}
		}
	}()
	select {
	case line := <-first:
		if line != "listening" {
			tb.Fatalf("squatter on %s: %q\n%s", addr, line, sq.stderr.String())
		}
	case <-time.After(10 * time.Second):
		tb.Fatalf("squatter on %s not listening within 10s\n%s", addr, sq.stderr.String())
	}
	return sq
}

// TestChildSaysNothingToAParentOfAnotherUser: a listener of another user
// on the parent's name is checked before hello and left unspoken to; the
// child names its uid and pid, and takes over from the real parent on the
// next name instead.
func TestChildSaysNothingToAParentOfAnotherUser(t *testing.T) {
	addrs := []string{testAddr(), testAddr()}
	sq := startSquatter(t, addrs[0])

	_, err := Dial(addrs[0], Identity{Epoch: 1}, time.Second)
	if !errors.Is(err, ErrNoParent) {
		t.Fatalf("Dial of a squatter: %v, want ErrNoParent", err)
	}
	for _, want := range []string{"uid 65534", fmt.Sprintf("pid %d", sq.pid), "another user"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Dial of a squatter: %q does not say %q", err, want)
		}
	}

	// The real parent, on the next name: the child skips the squatter
	// (with a warning naming it) and takes over from it.
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Address: addrs[1]})
	var logged lockedBuffer
	ch, err := DialParent(DialOptions{Addresses: addrs, Self: Identity{Epoch: 1}, Timeout: 2 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})})
	if err != nil {
		t.Fatalf("DialParent past a squatter: %v", err)
	}
	sockets, files, err := ch.Sockets()
	CloseFiles(files)
	ch.Close()
	if err != nil || len(sockets) != 1 || sockets[0].Address != r.listeners[0].Addr().String() {
		t.Fatalf("sockets from the parent past the squatter: %+v, %v; want the real parent's %s", sockets, err, r.listeners[0].Addr())
	}
	if p.Addr() != addrs[1] {
		t.Fatalf("parent on %s, want %s", p.Addr(), addrs[1])
	}
	for _, want := range []string{addrs[0], "uid 65534", fmt.Sprintf("pid %d", sq.pid), "not taking over from it"} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the child's warning does not say %q:\n%s", want, logged.String())
		}
	}

	// The squatter never heard a hello, let alone a request: it saw
	// connections close without one (its log of them is rate-limited).
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(sq.stderr.String(), "expected hello") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(sq.stderr.String(), "expected hello") {
		t.Errorf("the squatter did not see a connection end without a hello:\n%s", sq.stderr.String())
	}
	if strings.Contains(sq.stderr.String(), "next generation connected") || sq.stdout.String() != "listening\n" {
		t.Errorf("the squatter was spoken to:\nstdout: %s\nstderr: %s", sq.stdout.String(), sq.stderr.String())
	}
}

// TestParentSkipsANameHeldByAnotherUser: a generation whose restart socket
// another user holds listens on the next name, with a warning naming the
// squatter; with every name held, it says so; a name held by this user is
// still "another generation is running".
func TestParentSkipsANameHeldByAnotherUser(t *testing.T) {
	addrs := []string{testAddr(), testAddr(), testAddr()}
	sq := startSquatter(t, addrs[0])
	var logged lockedBuffer
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Address: addrs[0], Alternates: addrs[1:],
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})})
	if p.Addr() != addrs[1] {
		t.Fatalf("parent listens on %s, want the first free alternate %s", p.Addr(), addrs[1])
	}
	for _, want := range []string{addrs[0], "another user", "uid 65534", fmt.Sprintf("pid %d", sq.pid)} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the warning does not say %q:\n%s", want, logged.String())
		}
	}

	// This user's generation on addrs[1]: the next one of the same
	// epoch is refused, not moved to addrs[2].
	_, err := Listen(ParentOptions{Address: addrs[0], Alternates: addrs[1:], Handler: newRecorder(t, 1)})
	if !errors.Is(err, ErrGenerationRunning) {
		t.Fatalf("Listen with this user's generation on the alternate: %v, want ErrGenerationRunning", err)
	}

	// Every name squatted.
	_, err = Listen(ParentOptions{Address: addrs[0], Handler: newRecorder(t, 1)})
	if !errors.Is(err, ErrSquatted) || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("Listen with its only name squatted: %v, want ErrSquatted naming uid 65534", err)
	}
}

// TestChildChecksTheExpectedParent: told which process its parent is, the
// child takes over from that process only: another pid, or the same pid
// with another start time (reused), is skipped before hello.
func TestChildChecksTheExpectedParent(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	self := os.Getpid()
	started, err := ProcessStartTime(self)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		expect ExpectedParent
		refuse string // "" = takes over
	}{
		{ExpectedParent{}, ""},
		{ExpectedParent{PID: self}, ""},
		{ExpectedParent{PID: self, StartTime: started}, ""},
		{ExpectedParent{PID: self + 100000}, fmt.Sprintf("held by pid %d, not by the previous generation (pid %d", self, self+100000)},
		{ExpectedParent{PID: self, StartTime: started + 1}, "the pid was reused"},
	} {
		ch, err := DialParent(DialOptions{Addresses: []string{p.Addr()}, Self: Identity{Epoch: 1}, Expect: tc.expect})
		if tc.refuse == "" {
			if err != nil {
				t.Errorf("expecting %v: %v", tc.expect, err)
				continue
			}
			ch.Close()
			<-r.lost
			continue
		}
		if !errors.Is(err, ErrNoParent) || !strings.Contains(err.Error(), tc.refuse) {
			t.Errorf("expecting %v: %v, want ErrNoParent saying %q", tc.expect, err, tc.refuse)
		}
	}
	// Two connections were refused before hello: the parent saw them end
	// without one, and no child reached its handler. The parent accepts
	// them on its own goroutine, maybe after the child has gone: wait for
	// the count, not for an empty session set (which it is before the
	// accept too).
	for deadline := time.Now().Add(5 * time.Second); p.Refused() < 2 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	waitNoSessions(t, p)
	if got := p.Refused(); got != 2 {
		t.Errorf("the parent refused %d peers, want the 2 that were skipped unspoken to", got)
	}
}

func TestProcessStartTime(t *testing.T) {
	self, err := ProcessStartTime(os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("ProcessStartTime(self) = %d, %v", self, err)
	}
	again, _ := ProcessStartTime(os.Getpid())
	if again != self {
		t.Fatalf("start time changed: %d then %d", self, again)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep(1)")
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	child, err := ProcessStartTime(cmd.Process.Pid)
	if err != nil || child < self {
		t.Fatalf("child started at %d (%v), before this process (%d)", child, err, self)
	}
	if _, err := ProcessStartTime(1 << 30); err == nil {
		t.Fatal("ProcessStartTime of a pid that cannot exist: no error")
	}
}

func TestParseExpectedParent(t *testing.T) {
	for in, want := range map[string]ExpectedParent{
		"123":      {PID: 123},
		"123:4567": {PID: 123, StartTime: 4567},
	} {
		if got, err := ParseExpectedParent(in); err != nil || got != want {
			t.Errorf("ParseExpectedParent(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "x", "12:", "12:x", "12:0", ":5"} {
		if _, err := ParseExpectedParent(bad); err == nil || !strings.Contains(err.Error(), "PID") && !strings.Contains(err.Error(), "start time") {
			t.Errorf("ParseExpectedParent(%q): %v, want an error saying what is wanted", bad, err)
		}
	}
}

func TestAddresses(t *testing.T) {
	got := Addresses(3, 9, "")
	if len(got) != 1+MaxAlternates || got[0] != "@hotproxy.3.9" || got[1] != "@hotproxy.3.9.1" || got[MaxAlternates] != fmt.Sprintf("@hotproxy.3.9.%d", MaxAlternates) {
		t.Fatalf("Addresses(3, 9, \"\") = %q", got)
	}
	if got := Addresses(3, 9, "/run/x"); got[0] != "/run/x/hotproxy.3.9.sock" || got[2] != "/run/x/hotproxy.3.9.2.sock" {
		t.Fatalf("Addresses(3, 9, /run/x) = %q", got)
	}
	if Address(3, 9, "") != got[0] && Address(3, 9, "") != "@hotproxy.3.9" {
		t.Fatal("Address is not the first of Addresses")
	}
}

// TestASilentSquatterIsSkippedToo: a name bound without listen(2) cannot
// be asked who holds it (connecting is refused): the parent finds the
// holder's descriptor, names it and moves on, rather than taking it for a
// generation of its own and refusing to start; the child skips it as a
// name nobody answers on.
func TestASilentSquatterIsSkippedToo(t *testing.T) {
	addrs := []string{testAddr(), testAddr()}
	sq := startSquatter(t, addrs[0], squatSilentEnv+"=1")
	var logged lockedBuffer
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{Address: addrs[0], Alternates: addrs[1:],
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Info})})
	if p.Addr() != addrs[1] {
		t.Fatalf("parent listens on %s, want the alternate %s", p.Addr(), addrs[1])
	}
	if want := fmt.Sprintf("restart socket %s is held by another user (uid 65534, pid %d)", addrs[0], sq.pid); !strings.Contains(logged.String(), want) {
		t.Errorf("the warning does not say %q:\n%s", want, logged.String())
	}
	ch, err := DialParent(DialOptions{Addresses: addrs, Self: Identity{Epoch: 1}})
	if err != nil {
		t.Fatalf("DialParent past a silent squatter: %v", err)
	}
	ch.Close()
}
