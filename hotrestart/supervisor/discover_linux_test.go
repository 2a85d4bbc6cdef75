package supervisor

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// discoverSquatEnv makes the test binary, re-executed as nobody, bind the
// abstract name it holds, say "listening", and hold it until stdin closes.
const discoverSquatEnv = "SUPERVISOR_TEST_SQUAT"

func init() {
	addr := os.Getenv(discoverSquatEnv)
	if addr == "" {
		return
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	ln.Close()
	os.Exit(0)
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunningEpochSkipsAnotherUsersName: `supervise --take-over` finds
// the generation to take over from by the restart sockets listening. A
// name another user binds (a higher epoch, to be picked) is skipped with
// a warning; a generation on an alternate name counts for its epoch.
func TestRunningEpochSkipsAnotherUsersName(t *testing.T) {
	base := os.Getpid()<<4 | 3
	listen := func(name string) {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	listen(fmt.Sprintf("@hotproxy.%d.3", base))
	listen(fmt.Sprintf("@hotproxy.%d.4.2", base))  // epoch 4, on an alternate
	listen(fmt.Sprintf("@hotproxy.%d.5.99", base)) // not a name of ours
	if e, ok := runningEpoch(base, "", hclog.NewNullLogger()); !ok || e != 4 {
		t.Fatalf("runningEpoch = %d, %v; want 4 (the alternate of epoch 4)", e, ok)
	}

	if os.Geteuid() != 0 {
		t.Skipf("the rest needs root to bind a name as uid 65534 (nobody); running as uid %d", os.Geteuid())
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "supervisor-squatter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	exe := filepath.Join(dir, "squatter.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	squatted := fmt.Sprintf("@hotproxy.%d.9", base)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), discoverSquatEnv+"="+squatted)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Pdeathsig: syscall.SIGKILL}
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if l != "listening\n" {
			t.Fatalf("squatter: %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("squatter not listening within 10s")
	}
	var logged syncBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logged})
	if e, ok := runningEpoch(base, "", log); !ok || e != 4 {
		t.Fatalf("runningEpoch with %s squatted by nobody = %d, %v; want 4", squatted, e, ok)
	}
	if want := fmt.Sprintf("restart socket %s is held by another user (uid 65534, pid %d)", squatted, cmd.Process.Pid); !strings.Contains(logged.String(), want) {
		t.Errorf("the warning does not say %q:\n%s", want, logged.String())
	}
}
