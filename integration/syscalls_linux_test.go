package integration

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestKeepAliveNoReadThatFindsNothing runs keep-alive requests through a
// live proxy under strace and counts the read(2) calls that return EAGAIN
// and the peeks (recvfrom MSG_PEEK). Writing the upstream request and then
// reading costs such a read on nearly every request: the backend (here
// answering after 2 ms) cannot have answered yet. And writing the response
// and then waiting for the next request cost a peek per request (Go's
// poller forgets a readiness seen before the wait). The proxy now arms
// each wait first and writes from inside it (upstream.Conn.SendThenRead,
// clientConn.writeLast), so both are gone (issue 22).
func TestKeepAliveNoReadThatFindsNothing(t *testing.T) {
	t.Parallel()
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed (apt-get install strace): it counts the proxy's system calls")
	}
	b := harness.StartHTTPBackend(t, "b1")
	cfg := httpProxyConfig(b.Addr)
	cfg.Concurrency = 1
	p := harness.Start(t, cfg)

	c, err := net.DialTimeout("tcp", p.Addr("web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ask := func() {
		t.Helper()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, "GET /slow?ms=2 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "b1\n" {
			t.Fatalf("response: %s %q %v", resp.Status, body, err)
		}
	}
	ask() // the upstream connection is dialed and pooled before tracing

	const requests = 50
	trace := straceDuring(t, strace, p.PID(), []string{"-e", "trace=read,recvfrom"}, func() {
		for range requests {
			ask()
		}
	})
	reads, eagain, peeks := 0, 0, 0
	for line := range strings.Lines(trace) {
		if strings.Contains(line, "MSG_PEEK") {
			peeks++
			continue
		}
		// read(2) or recvfrom(2) (internal/nbio's, on Linux).
		if !strings.Contains(line, "read(") && !strings.Contains(line, "read resumed>") &&
			!strings.Contains(line, "recvfrom(") && !strings.Contains(line, "recvfrom resumed>") {
			continue
		}
		if strings.Contains(line, "<unfinished ...>") {
			continue // counted at its "resumed" line
		}
		reads++
		if strings.Contains(line, "= -1 EAGAIN") {
			eagain++
		}
	}
	if reads < requests {
		t.Fatalf("strace saw %d reads for %d requests: not tracing the proxy?\n%s", reads, requests, trace)
	}
	// Before the change: about one per request (50 of ~150).
	if eagain > requests/10 {
		t.Errorf("%d of %d reads returned EAGAIN over %d keep-alive requests (want at most %d): a read that finds nothing is back on the request path",
			eagain, reads, requests, requests/10)
	}
	// Before the change: one per request.
	if peeks > requests/10 {
		t.Errorf("%d peeks (recvfrom MSG_PEEK) over %d keep-alive requests (want at most %d): the idle wait peeks again after each response",
			peeks, requests, requests/10)
	}
	t.Logf("%d requests: %d reads, %d of them EAGAIN; %d peeks", requests, reads, eagain, peeks)
}

// straceDuring runs do with strace attached to the process pid and all
// its threads (tracing what args say, e.g. "-e", "trace=read") and
// returns the trace: strace has attached before do starts (it says
// "Process N attached"), and has written everything once it returns.
func straceDuring(t *testing.T, strace string, pid int, args []string, do func()) string {
	t.Helper()
	out := t.TempDir() + "/trace"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := exec.CommandContext(ctx, strace, append(append([]string{"-f"}, args...), "-o", out, "-p", strconv.Itoa(pid))...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	st.Stderr = pw
	if err := st.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			st.Process.Signal(syscall.SIGINT)
			st.Wait()
		}
	}
	defer stop()
	var attached bytes.Buffer
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		attached.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "attached") {
			break
		}
	}
	if !strings.Contains(attached.String(), "attached") {
		t.Fatalf("strace did not attach to pid %d: %s", pid, attached.String())
	}
	go io.Copy(io.Discard, pr)
	do()
	stop()
	trace, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(trace)
}
