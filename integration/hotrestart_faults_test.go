package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// faultLoad is the load every fault test runs through the serving
// generation: keep-alive, a few clients, each response checked.
func faultLoad(t *testing.T, g *harness.Generation, clients int) *steadyLoad {
	t.Helper()
	l := startSteadyLoad(t, loadgen.Options{
		URL: g.URL("web", "/"), Mode: loadgen.KeepAlive, Clients: clients,
		Requests: 1000, Timeout: 5 * time.Second, Check: backendCheck("b1"),
	})
	l.WaitMore(t, 200)
	return l
}

// wantServing asserts that g answers /server_info as a LIVE generation of
// its epoch and that a request through the listener is served by it.
func wantServing(t *testing.T, g *harness.Generation) {
	t.Helper()
	info, _ := infoFrom(t, g)
	if e, _ := info.Int("epoch"); e != g.Epoch || info.String("state") != "LIVE" {
		t.Fatalf("pid %d: epoch %d state %s, want epoch %d LIVE", g.PID(), e, info.String("state"), g.Epoch)
	}
	if code, body := g.AdminGet("/ready"); code != 200 {
		t.Fatalf("pid %d: /ready %d %s", g.PID(), code, body)
	}
	if pid := getPID(t, newClient(5*time.Second), g.URL("web", "/pid")); pid != g.PID() {
		t.Fatalf("/pid answered by %d, want %d (epoch %d)", pid, g.PID(), g.Epoch)
	}
}

// wantNoFailures stops the load and asserts that nothing failed.
func wantNoFailures(t *testing.T, l *steadyLoad) int64 {
	t.Helper()
	res := l.Stop()
	t.Logf("load: %v", res)
	if res.Failed() != 0 {
		t.Errorf("%d failed requests: %v", res.Failed(), res)
	}
	return res.Total()
}

// waitExitCode waits for g to exit and returns its code, failing on
// timeout.
func waitExitCode(t *testing.T, g *harness.Generation) int {
	t.Helper()
	code, err := g.Wait(exitTimeout)
	if err != nil {
		t.Fatalf("%v\n%s", err, g.Output())
	}
	return code
}

// TestHotRestartBadConfigChild: a child whose config has an unknown key
// exits non-zero naming the key, says FAILED on its ready fd, and the
// parent serves on (epoch 0, LIVE) with zero failures under load; a good
// child afterwards takes over.
func TestHotRestartBadConfigChild(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, restartConfig("1s", "2s", "100ms", b.Addr))
	g0 := c.serving
	load := faultLoad(t, g0, 4)

	good, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	bad := writeConfigFile(t, strings.Replace(string(good), "[server]\n", "[server]\nno_such_key = 1\n", 1))
	child := harness.StartGeneration(t, bad, c.baseID, 1, harness.LaunchOptions{})
	line, err := child.ReadyLine(readyFDTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if code := waitExitCode(t, child); code == 0 {
		t.Fatalf("the child with a bad config exited 0\n%s", child.Output())
	}
	if !strings.HasPrefix(line, "FAILED ") || !strings.Contains(line, "no_such_key") {
		t.Errorf("ready fd: %q, want FAILED naming no_such_key", line)
	}
	wantContains(t, "the bad child's stderr", child.Stderr(), "no_such_key")

	load.WaitMore(t, 500)
	wantServing(t, g0)
	if g0.Exited() {
		t.Fatal("the parent exited")
	}
	total := wantNoFailures(t, load)
	checkRqTotal(t, g0, "web", total+1) // the /pid request of wantServing

	g1, _ := c.restart()
	waitExit0(t, g0, exitTimeout)
	wantServing(t, g1)
}

// TestHotRestartChildKilledBeforeReady: a child SIGKILLed after it has
// received the sockets but before it serves leaves the parent serving with
// zero failures, its listening sockets still non-blocking, and nothing
// stuck: the next child of the same epoch takes over normally and the
// parent drains and exits 0.
func TestHotRestartChildKilledBeforeReady(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, restartConfig("1s", "2s", "100ms", b.Addr))
	g0 := c.serving
	load := faultLoad(t, g0, 4)

	child := c.launch(1, harness.LaunchOptions{Args: []string{"--test-stop-after-takeover"}})
	deadline := time.Now().Add(readyFDTimeout)
	for {
		st, err := child.ProcState()
		if err == nil && st == 'T' {
			break
		}
		if child.Exited() {
			t.Fatalf("the child exited (code %d) instead of stopping after the takeover\n%s", child.ExitCode(), child.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did not stop after the takeover within %v (state %c, %v)\n%s", readyFDTimeout, st, err, child.Output())
		}
		time.Sleep(pollEvery)
	}
	// Its log line may still be in the pipe the harness copies from.
	if err := child.WaitStderr("stopping after the takeover", 5*time.Second); err != nil {
		t.Error(err)
	}
	load.WaitMore(t, 300) // the parent serves while the child holds its sockets
	child.Signal(syscall.SIGKILL)
	if code := waitExitCode(t, child); code != -1 {
		t.Fatalf("SIGKILLed child: exit code %d", code)
	}
	if line, _ := child.ReadyLine(time.Second); line != "" {
		t.Errorf("the killed child said %q on its ready fd", line)
	}
	if err := g0.WaitStderr("went away before it served", 5*time.Second); err != nil {
		t.Error(err)
	}
	load.WaitMore(t, 500)
	wantServing(t, g0)
	total := wantNoFailures(t, load)
	// The parent handed dups of its listening sockets to the child; they
	// share the open file description, so its O_NONBLOCK flag too. A
	// blocking listening socket cannot be woken by a deadline: the
	// parent's next drain would hang in accept(2).
	wantNonblockingListeners(t, g0)

	g1, _ := c.restart() // epoch 1 again
	waitExit0(t, g0, exitTimeout)
	wantServing(t, g1)
	checkRqTotal(t, g1, "web", total+2)
}

// TestHotRestartChildDiesInCommitWindow: a child SIGKILLed after READY,
// within the commit window, makes the parent serve again (rollback). The
// load is keep-alive with two clients: the only requests allowed to fail
// are those on the connections the killed child had accepted, at most one
// per client (a request in flight on it, or one the transport retried
// after finding it dead), and only as a reset, an EOF or a retry.
func TestHotRestartChildDiesInCommitWindow(t *testing.T) {
	const clients = 2
	b := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, restartConfig("1s", "2s", "3s", b.Addr))
	g0 := c.serving
	load := faultLoad(t, g0, clients)

	child := c.launch(1, harness.LaunchOptions{})
	if err := child.WaitReadyFD(readyFDTimeout); err != nil {
		t.Fatalf("%v\n%s", err, child.Output())
	}
	// Let the clients move to the child (the parent answers them with
	// Connection: close), so the kill hits connections it accepted.
	load.WaitMore(t, 100)
	child.Signal(syscall.SIGKILL)
	if code := waitExitCode(t, child); code != -1 {
		t.Fatalf("SIGKILLed child: exit code %d", code)
	}
	if err := g0.WaitStderr("serving again after a failed hand-over", 5*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, g0.Output())
	}
	load.WaitMore(t, 500)
	wantServing(t, g0)
	res := load.Stop()
	t.Logf("load: %v", res)
	allowed := res.Count(loadgen.ClassReset) + res.Count(loadgen.ClassEOF) + res.Retried
	if res.Failed() != allowed || res.Failed() > clients {
		t.Errorf("failures beyond the child's own connections (at most %d, as reset, eof or retried): %v", clients, res)
	}

	g1, _ := c.restart()
	waitExit0(t, g0, exitTimeout+3*time.Second)
	wantServing(t, g1)
}

// TestHotRestartParentKilledWhileDraining: the parent, held in its drain by
// a TCP-proxy connection, is SIGKILLed once the child serves and the parent
// holds no HTTP client connection; the child serves on with zero failures
// and (with stats) the totals still hold the parent's counts.
func TestHotRestartParentKilledWhileDraining(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	echo := harness.StartTCPEchoBackend(t)
	cfg := restartConfig("1s", "30s", "100ms", b.Addr)
	cfg.Listeners = append(cfg.Listeners, harness.Listener{Name: "stream", Protocol: "tcp", Cluster: "echo"})
	cfg.Clusters = append(cfg.Clusters, harness.Cluster{Name: "echo", Endpoints: []string{echo.Addr}, ConnectTimeout: "1s"})
	c := startChain(t, cfg)
	g0 := c.serving
	load := faultLoad(t, g0, 4)

	held, err := net.DialTimeout("tcp", g0.Addr("stream"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	held.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := held.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(held, make([]byte, 1)); err != nil {
		t.Fatalf("echo through epoch 0: %v", err)
	}

	g1, _ := c.restart()
	if err := g0.WaitStderr("hand-over committed", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Wait until the keep-alive clients have all left the parent (each got
	// Connection: close): then killing it cuts no HTTP request.
	webPort := portOf(t, g0.Addr("web"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := establishedOn(g0.PID(), webPort)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the draining parent still holds %d client connections on %s", n, g0.Addr("web"))
		}
		time.Sleep(pollEvery)
	}
	if g0.Exited() {
		t.Fatalf("the parent exited (code %d) with a TCP connection open", g0.ExitCode())
	}
	if strings.Contains(g0.Stderr(), "drained after the hand-over") {
		t.Fatalf("the parent finished its drain with a TCP connection open\n%s", g0.Output())
	}
	g0.Signal(syscall.SIGKILL)
	if code := waitExitCode(t, g0); code != -1 {
		t.Fatalf("SIGKILLed parent: exit code %d", code)
	}
	load.WaitMore(t, 1000)
	wantServing(t, g1)
	total := wantNoFailures(t, load)
	checkRqTotal(t, g1, "web", total+1)
}

// TestHotRestartSocketRefusesStrangers: peers that speak garbage, an
// unknown message or an incompatible protocol on the restart socket get an
// error reply and a closed socket; a generation running as another uid is
// refused and exits non-zero saying why. The serving generation is
// unaffected throughout, and a real child still takes over afterwards.
func TestHotRestartSocketRefusesStrangers(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, restartConfig("1s", "2s", "100ms", b.Addr))
	g0 := c.serving
	load := faultLoad(t, g0, 4)
	addr := fmt.Sprintf("@hotproxy.%d.0", c.baseID)

	for _, tc := range []struct {
		name, send, reply string
	}{
		{"garbage", "\x00\xffthis is not a message\n", "malformed"},
		{"unknown message", `{"type":"give_me_everything"}`, "unknown message type"},
		{"sockets before hello", `{"type":"get_sockets"}`, "expected hello"},
		{"incompatible protocol", `{"type":"hello","version":"99.0","identity":{"pid":1,"epoch":1,"binary_version":"x"}}`, "incompatible"},
	} {
		reply, err := restartSocketExchange(addr, tc.send)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !strings.Contains(reply, `"type":"error"`) || !strings.Contains(reply, tc.reply) {
			t.Errorf("%s: reply %q, want an error mentioning %q", tc.name, reply, tc.reply)
		}
		t.Logf("%s: %s", tc.name, reply)
	}
	load.WaitMore(t, 300)

	t.Run("other uid", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to run a generation as uid 65534 (nobody)")
		}
		// Neither the build directory nor the test's temporary directory
		// is readable by nobody: copy the binary and the config to a
		// directory that is.
		dir, err := os.MkdirTemp("", "hotproxy-nobody-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		bin, cfgPath := filepath.Join(dir, "hotproxy"), filepath.Join(dir, "hotproxy.toml")
		harness.CopyExecutable(t, harness.Binary(t), bin)
		if b, err := os.ReadFile(c.cfgPath); err != nil {
			t.Fatal(err)
		} else if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
		stranger := harness.StartGeneration(t, cfgPath, c.baseID, 1, harness.LaunchOptions{
			Binary:     bin,
			Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
		})
		line, err := stranger.ReadyLine(readyFDTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if code := waitExitCode(t, stranger); code == 0 {
			t.Fatalf("a generation running as uid 65534 exited 0\n%s", stranger.Output())
		}
		wantContains(t, "the refused generation's stderr", stranger.Stderr(), "uid 65534", "only uid 0 or root")
		if !strings.HasPrefix(line, "FAILED ") {
			t.Errorf("ready fd: %q, want FAILED", line)
		}
		if err := g0.WaitStderr("refused a peer on the restart socket: peer runs as uid 65534", 5*time.Second); err != nil {
			t.Error(err)
		}
	})

	load.WaitMore(t, 300)
	wantServing(t, g0)
	total := wantNoFailures(t, load)

	g1, _ := c.restart()
	waitExit0(t, g0, exitTimeout)
	wantServing(t, g1)
	checkRqTotal(t, g1, "web", total+2)
}

// restartSocketExchange connects to a restart socket, sends one datagram
// and returns the reply, checking that the parent then closes the
// connection.
func restartSocketExchange(addr, msg string) (string, error) {
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(msg)); err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		return "", fmt.Errorf("no reply: %w", err)
	}
	reply := string(buf[:n])
	if n, err := conn.Read(buf); !errors.Is(err, io.EOF) {
		return reply, fmt.Errorf("after the reply the connection should close: read %d bytes, %v", n, err)
	}
	return reply, nil
}

// wantNonblockingListeners asserts that every listening TCP socket g holds
// is in non-blocking mode (O_NONBLOCK in /proc/PID/fdinfo): Go's accept
// loops stop on a deadline only then.
func wantNonblockingListeners(t *testing.T, g *harness.Generation) {
	t.Helper()
	socks, err := listeningSockets(g.PID())
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) == 0 {
		t.Fatalf("pid %d holds no listening TCP socket", g.PID())
	}
	for _, s := range socks {
		if s.flags&syscall.O_NONBLOCK == 0 {
			t.Errorf("pid %d: listening socket %s (fd %d) is in blocking mode (fdinfo flags %#o): "+
				"a deadline cannot wake its accept loop, so a drain of this generation hangs", g.PID(), s.local, s.fd, s.flags)
		}
	}
}

type listeningSocket struct {
	fd    int
	local string // hex "ADDR:PORT" as /proc/net/tcp has it
	flags int64
}

// listeningSockets lists the listening TCP sockets of pid with their file
// status flags, from /proc.
func listeningSockets(pid int) ([]listeningSocket, error) {
	listening := map[string]string{} // inode -> local address
	for _, file := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) >= 10 && fs[3] == "0A" {
				listening[fs[9]] = fs[1]
			}
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []listeningSocket
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		local, ok := listening[strings.Trim(strings.TrimPrefix(l, "socket:"), "[]")]
		if !ok {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			return nil, err
		}
		var flags int64 = -1
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				if err != nil {
					return nil, fmt.Errorf("fdinfo flags %q: %w", v, err)
				}
			}
		}
		fd, _ := strconv.Atoi(e.Name())
		out = append(out, listeningSocket{fd: fd, local: local, flags: flags})
	}
	return out, nil
}
