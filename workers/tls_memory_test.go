package workers

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// idleClientEnv makes TestIdleClientProcess the client of
// TestTLSIdleMemory and TestBurstMemoryGivenBack: "address count
// tls|plain|burst".
const idleClientEnv = "HOTPROXY_TEST_IDLE_CLIENT"

// TestTLSIdleMemory measures what an idle keep-alive connection costs the
// proxy, TLS and plaintext, with the clients in another process (this test
// binary, run again) so that only the proxy's side is counted. An idle TLS
// connection must not hold a 32 KiB read buffer (waitTLSRecord reads one
// byte); what it holds is crypto/tls's own state.
func TestTLSIdleMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a client process and 400 connections")
	}
	const n = 200
	plain := httpListener("plain", directRoute("ok"))
	secure := httpListener("web", directRoute("ok"))
	withTLS(&secure)
	m := startTLSManager(t, &config.Config{Listeners: []config.Listener{plain, secure}}, 1)
	perConn := func(listener, mode string) (heap, stack float64) {
		t.Helper()
		before := heapAfterGC()
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleClientProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", idleClientEnv, addr(t, m, listener), n, mode))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			stdin.Close() // the client's cue to exit
			cmd.Wait()
			waitFor(t, 10*time.Second, "the client's connections to close", func() bool { return m.workers[0].conns.len() == 0 })
		}()
		ready := make(chan string, 1)
		go func() {
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			ready <- line
			io.Copy(io.Discard, stdout)
		}()
		select {
		case line := <-ready:
			if strings.TrimSpace(line) != "ready" {
				t.Fatalf("client process: %q", line)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the client process did not get ready in 60s")
		}
		waitFor(t, 10*time.Second, "every connection to be idle", func() bool { return idleConns(m) == n })
		after := heapAfterGC()
		return float64(after.HeapAlloc-before.HeapAlloc) / n, float64(after.StackInuse-before.StackInuse) / n
	}
	plainHeap, plainStack := perConn("plain", "plain")
	tlsHeap, tlsStack := perConn("web", "tls")
	t.Logf("idle keep-alive connection, proxy side: plaintext %.1f KiB heap + %.1f KiB stack; TLS %.1f KiB heap + %.1f KiB stack",
		plainHeap/1024, plainStack/1024, tlsHeap/1024, tlsStack/1024)
	if tlsHeap >= httpfront.IOBufSize {
		t.Fatalf("an idle TLS connection costs %.1f KiB of heap: it holds a read buffer (%d KiB) it should not", tlsHeap/1024, httpfront.IOBufSize>>10)
	}
}

func heapAfterGC() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// idleConns counts the connections waiting between requests.
func idleConns(m *Manager) int {
	n := 0
	for _, wk := range m.workers {
		wk.conns.mu.Lock()
		for c := range wk.conns.m {
			if cc, ok := c.(*httpfront.Conn); ok && cc.Idle() {
				n++
			}
		}
		wk.conns.mu.Unlock()
	}
	return n
}

// TestIdleClientProcess is TestTLSIdleMemory's client, in a process of
// its own: it opens the connections, makes a request on each, says
// "ready" and holds them until its stdin closes.
func TestIdleClientProcess(t *testing.T) {
	spec := os.Getenv(idleClientEnv)
	if spec == "" {
		t.Skip("run by TestTLSIdleMemory only")
	}
	f := strings.Fields(spec)
	a, mode := f[0], f[2]
	n, _ := strconv.Atoi(f[1])
	if mode == "burst" {
		burstClient(t, a, n)
		return
	}
	var conns []net.Conn
	for range n {
		var c net.Conn
		var err error
		if mode == "tls" {
			c, err = tls.Dial("tcp", a, &tls.Config{ServerName: "a.example.com", RootCAs: demoCAPool(t)})
		} else {
			c, err = net.Dial("tcp", a)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		readResponses(t, bufio.NewReader(c), 1)
		conns = append(conns, c)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}

// burstClient is TestIdleClientProcess for TestBurstMemoryGivenBack: it
// opens n connections, then sends a request on every one before it reads
// any response, reads them all, says "ready" and holds the connections
// until its stdin closes.
func burstClient(t *testing.T, a string, n int) {
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, n, err)
		}
		conns[i] = c
	}
	for i, c := range conns {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			t.Fatalf("request %d of %d: %v", i+1, n, err)
		}
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		readResponses(t, bufio.NewReader(c), 1)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
}
