package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestHotRestartTCPStreamSurvives: a TCP-proxy connection streaming data
// through epoch 0 while epoch 1 takes over finishes intact (the echoed
// bytes hash to what was sent); the old generation outlives its drain_time
// for it, and exits 0 once it ends, well before parent_shutdown_time.
func TestHotRestartTCPStreamSurvives(t *testing.T) {
	const (
		half       = 6 << 20 // bytes before the restart, and after it
		chunk      = 256 << 10
		pauseAfter = 60 * time.Millisecond // between chunks after the restart
		drainTime  = time.Second
	)
	echo := harness.StartTCPEchoBackend(t)
	cfg := restartConfig(drainTime.String(), "20s", "100ms", echo.Addr)
	cfg.Listeners = append(cfg.Listeners, harness.Listener{Name: "stream", Protocol: "tcp", Cluster: "echo"})
	cfg.Clusters = append(cfg.Clusters, harness.Cluster{Name: "echo", Endpoints: []string{echo.Addr}, ConnectTimeout: "1s"})
	c := startChain(t, cfg)
	g0 := c.serving

	conn, err := net.DialTimeout("tcp", g0.Addr("stream"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	type result struct {
		n   int64
		sum string
		err error
	}
	echoed := make(chan result, 1)
	go func() {
		n, sum, err := harness.SHA256Reader(conn)
		echoed <- result{n, sum, err}
	}()
	src := harness.PatternReader(2 * half)
	buf := make([]byte, chunk)
	send := func(n int, pause time.Duration) {
		t.Helper()
		for sent := 0; sent < n; sent += chunk {
			if _, err := io.ReadFull(src, buf); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write(buf); err != nil {
				t.Fatalf("write after %d bytes of this part: %v", sent, err)
			}
			if pause > 0 {
				time.Sleep(pause) // shapes the stream to span the drain
			}
		}
	}
	send(half, 0)

	g1, _ := c.restart()
	if err := g0.WaitStderr("handing over to the next generation", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	drainStart := time.Now()
	send(half, pauseAfter)
	streamed := time.Since(drainStart)
	if g0.Exited() {
		t.Fatalf("epoch 0 exited (code %d) while its TCP connection was open, %v into its drain", g0.ExitCode(), streamed)
	}
	if streamed <= drainTime {
		t.Fatalf("the stream ended %v into the drain, not after drain_time %v: the test proves nothing", streamed, drainTime)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	r := <-echoed
	if r.err != nil {
		t.Fatalf("reading the echo: %v after %d bytes", r.err, r.n)
	}
	if want := harness.PatternSHA256(2 * half); r.n != 2*half || r.sum != want {
		t.Fatalf("echo: %d bytes sha256 %s, want %d bytes sha256 %s", r.n, r.sum, 2*half, want)
	}
	conn.Close()
	ended := time.Now()
	waitExit0(t, g0, 5*time.Second)
	t.Logf("%d MiB echoed intact through epoch 0 across the hand-over to epoch 1 (pid %d); the stream ran %v into epoch 0's drain, which exited %v after the connection closed",
		2*half>>20, g1.PID(), streamed.Round(time.Millisecond), time.Since(ended).Round(time.Millisecond))
}

// TestHotRestartKeepAliveGetsConnectionClose: a keep-alive client of the
// old generation gets its next response from the old generation with
// "Connection: close", sees the connection end cleanly, and its next
// connection is served by the new generation.
func TestHotRestartKeepAliveGetsConnectionClose(t *testing.T) {
	b := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, restartConfig("5s", "10s", "100ms", b.Addr))
	g0 := c.serving

	conn, err := net.DialTimeout("tcp", g0.Addr("web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	ask := func() (pid int, closing bool) {
		t.Helper()
		if _, err := io.WriteString(conn, "GET /pid HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			t.Fatalf("write: %v", err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("response %s, body %q, err %v", resp.Status, body, err)
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(body)))
		if err != nil {
			t.Fatalf("body %q", body)
		}
		return pid, resp.Close
	}
	if pid, closing := ask(); pid != g0.PID() || closing {
		t.Fatalf("before the restart: pid %d (want %d), Connection: close %v", pid, g0.PID(), closing)
	}

	g1, _ := c.restart()
	// READY is written once the old generation has agreed to drain; its
	// main loop starts the drain a moment later, and logs it.
	if err := g0.WaitStderr("handing over to the next generation", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The first request after that is answered by the old generation with
	// Connection: close. The drain flag is set a few instructions after the
	// log line, so allow a bounded number of requests for that window; each
	// must still come from the old generation.
	asked := 0
	for {
		asked++
		pid, closing := ask()
		if pid != g0.PID() {
			t.Fatalf("request %d on the old connection answered by pid %d, want the old generation %d", asked, pid, g0.PID())
		}
		if closing {
			break
		}
		if asked == 20 {
			t.Fatalf("20 responses from the draining generation without Connection: close")
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after Connection: close the old generation should close the connection: read %v", err)
	}
	t.Logf("Connection: close on request %d after the drain began", asked)

	client := newClient(5 * time.Second)
	if pid := getPID(t, client, g1.URL("web", "/pid")); pid != g1.PID() {
		t.Errorf("a new connection was answered by pid %d, want the new generation %d", pid, g1.PID())
	}
	waitExit0(t, g0, exitTimeout)
}
