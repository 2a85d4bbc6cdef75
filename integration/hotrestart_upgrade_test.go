package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// upgradeEchoBackend answers every request that asks for "Upgrade: echo"
// with 101 and then echoes bytes; other requests get 200 "plain".
func upgradeEchoBackend(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !strings.EqualFold(req.Header.Get("Upgrade"), "echo") {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain")
						continue
					}
					io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
					io.Copy(c, br)
					return
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestHotRestartUpgradedConnectionSurvives: a connection upgraded through
// epoch 0 (WebSocket-like: 101, then bytes both ways) keeps echoing while
// epoch 1 takes over and serves new upgrades, until epoch 0's drain_time
// closes it; the old generation then exits 0.
func TestHotRestartUpgradedConnectionSurvives(t *testing.T) {
	const drainTime = 2 * time.Second
	be := upgradeEchoBackend(t)
	c := startChain(t, restartConfig(drainTime.String(), "10s", "100ms", be))
	g0 := c.serving

	upgrade := func(addr string) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 101 || !strings.EqualFold(resp.Header.Get("Upgrade"), "echo") {
			t.Fatalf("upgrade: %d %v", resp.StatusCode, resp.Header)
		}
		return conn, br
	}
	echo := func(conn net.Conn, br *bufio.Reader, msg string) error {
		if _, err := io.WriteString(conn, msg); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			t.Fatalf("echo %q, want %q", buf, msg)
		}
		return nil
	}

	old, oldBr := upgrade(g0.Addr("web"))
	if err := echo(old, oldBr, "before the restart"); err != nil {
		t.Fatal(err)
	}
	g1, _ := c.restart()
	if err := g0.WaitStderr("handing over to the next generation", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	drainStart := time.Now()
	// The old tunnel keeps working into the drain.
	for i := 0; time.Since(drainStart) < drainTime/2; i++ {
		if err := echo(old, oldBr, "during the drain"); err != nil {
			t.Fatalf("the upgraded connection failed %v into the drain: %v", time.Since(drainStart), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// New upgrades reach the new generation.
	fresh, freshBr := upgrade(g1.Addr("web"))
	if err := echo(fresh, freshBr, "after the restart"); err != nil {
		t.Fatal(err)
	}
	// drain_time ends the old tunnel; the old generation exits 0.
	old.SetReadDeadline(time.Now().Add(drainTime + 5*time.Second))
	if _, err := io.Copy(io.Discard, oldBr); err != nil && !isReset(err) {
		t.Fatalf("the old tunnel ended with %v", err)
	}
	waitExit0(t, g0, 10*time.Second)
	if err := echo(fresh, freshBr, "still there"); err != nil {
		t.Fatal(err)
	}
}

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}
