package integration

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"golang.org/x/net/http2"
)

// TestHTTP2UpstreamNoReadThatFindsNothing is
// TestKeepAliveNoReadThatFindsNothing for an HTTP/2 stream proxied to an
// HTTP/1.1 upstream: under strace, the proxy's read(2) calls on its
// upstream connection that return EAGAIN. Writing the upstream request
// and then reading the response head cost one on nearly every request
// (the backend, answering after 2 ms, cannot have answered yet); the
// stream front end now sends a buffered request from inside the wait
// (upstream.Conn.SendThenRead), so the read comes only once the answer
// is there (issue 21).
func TestHTTP2UpstreamNoReadThatFindsNothing(t *testing.T) {
	t.Parallel()
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace is not installed (apt-get install strace): it counts the proxy's system calls")
	}
	b := harness.StartHTTPBackend(t, "b1")
	cfg := httpProxyConfig(b.Addr)
	cfg.Concurrency = 1
	cfg.Listeners[0].HTTP2Cleartext = true
	p := harness.Start(t, cfg)

	// h2c with prior knowledge: one connection, one stream at a time.
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := "http://" + p.Addr("web") + "/slow?ms=2"
	ask := func() {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || resp.ProtoMajor != 2 || string(body) != "b1\n" {
			t.Fatalf("response: %s %s %q %v", resp.Proto, resp.Status, body, err)
		}
	}
	ask() // the upstream connection is dialed and pooled before tracing

	const requests = 50
	// -yy names each fd's endpoints, so that the upstream connection's
	// reads can be told from the client connection's.
	trace := straceDuring(t, strace, p.PID(), []string{"-yy", "-e", "trace=read,recvfrom"}, func() {
		for range requests {
			ask()
		}
	})
	// An upstream fd prints as 9<TCP:[127.0.0.1:40000->127.0.0.1:PORT]>.
	upstreamFD := "->" + b.Addr + "]>"
	// read(2), or recvfrom(2) (internal/nbio's, on Linux).
	upstreamRead := func(call string) bool {
		return strings.Contains(call, upstreamFD) &&
			(strings.Contains(call, "read(") || strings.Contains(call, "recvfrom("))
	}
	reads, eagain := 0, 0
	// A call that another thread's call interrupts in the trace is split
	// in two lines, the second without the descriptor: "TID
	// recvfrom(19<TCP:[...]>, <unfinished ...>", then "TID <...
	// recvfrom resumed>..." with the result. unfinished holds the
	// threads whose upstream read is split so.
	unfinished := map[string]bool{}
	for line := range strings.Lines(trace) {
		tid, call, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case strings.Contains(call, "<unfinished ...>"):
			if upstreamRead(call) {
				unfinished[tid] = true
			}
			continue
		case strings.Contains(call, " resumed>"):
			if !unfinished[tid] {
				continue
			}
			delete(unfinished, tid)
		case !upstreamRead(call):
			continue
		}
		reads++
		if strings.Contains(line, "= -1 EAGAIN") {
			eagain++
		}
	}
	if reads < requests {
		t.Fatalf("strace saw %d reads on the upstream connection (%s) for %d requests: not tracing the proxy?\n%s", reads, b.Addr, requests, trace)
	}
	// Before the change: one per request (50 of ~100).
	if eagain > requests/10 {
		t.Errorf("%d of %d upstream reads returned EAGAIN over %d HTTP/2 requests (want at most %d): a read that finds nothing is back on the HTTP/2 to HTTP/1.1 path",
			eagain, reads, requests, requests/10)
	}
	t.Logf("%d HTTP/2 requests: %d upstream reads, %d of them EAGAIN", requests, reads, eagain)
}
