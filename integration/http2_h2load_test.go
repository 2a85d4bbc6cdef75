package integration

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// h2loadReloads is how many hot restarts TestHTTP2ReloadH2Load makes under
// h2load (issue 20's Done-means: 50).
const h2loadReloads = 50

// TestHTTP2ReloadH2Load (issue 20 item 9): 50 hot restarts under an h2load
// TLS h2 load (nghttp2's client, which never retries a request): no
// request fails. A drain's single GOAWAY carried the last stream the
// server had read, and refused the streams the client was sending at that
// moment (0–78 failed in four storms of 50); the graceful two-phase GOAWAY
// (RFC 9113 §6.8) serves them. Skips when h2load (Debian's nghttp2-client)
// is not installed.
//
// h2load never opens a new HTTP/2 connection after a GOAWAY, and counts
// the requests it has not sent yet as failed (that is the client, not the
// server): so each run sends all its requests in its first flight (-m at
// least the requests per connection), and runs follow each other for the
// whole storm, two at a time.
func TestHTTP2ReloadH2Load(t *testing.T) {
	h2load, err := exec.LookPath("h2load")
	if err != nil {
		t.Skip("h2load not installed (Debian package nghttp2-client): the reload storm under h2load is not run")
	}
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, h2ReloadConfig(demo, backend.Addr))
	base := c.serving.HTTPSURL("h2tls", "")

	// Sized for a busy 2-core machine: each run is 4 connections of 8
	// streams over TLS with ALPN h2, on a route to the backend and one
	// the proxy answers itself.
	stop := make(chan struct{})
	type loadResult struct {
		runs int
		sum  h2loadResult
		err  error
	}
	results := make(chan loadResult, 2)
	for range 2 {
		go func() {
			var lr loadResult
			defer func() { results <- lr }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				args := []string{"-c", "4", "-m", "8", "-n", "32", "-t", "1", "--npn-list", "h2", base + "/", base + "/epoch"}
				out, err := exec.CommandContext(ctx, h2load, args...).CombinedOutput()
				cancel()
				if err != nil {
					lr.err = fmt.Errorf("h2load run %d: %v\n%s", lr.runs+1, err, out)
					return
				}
				res, err := parseH2load(string(out))
				if err != nil {
					lr.err = fmt.Errorf("h2load run %d: %v\n%s", lr.runs+1, err, out)
					return
				}
				lr.runs++
				lr.sum.add(res)
				if res.failed != 0 || res.errored != 0 || res.timeout != 0 || res.status2xx != res.succeeded {
					lr.err = fmt.Errorf("h2load run %d: %d failed, %d errored, %d timed out, %d of %d succeeded with 2xx\n%s",
						lr.runs, res.failed, res.errored, res.timeout, res.status2xx, res.succeeded, out)
				}
			}
		}()
	}

	start := time.Now()
	for range h2loadReloads {
		c.restart()
		// Pacing, not synchronisation: a reload every 100 ms or so on
		// top of the time a generation takes to start.
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d reloads in %v", h2loadReloads, time.Since(start).Round(time.Millisecond))
	close(stop)
	var total h2loadResult
	runs := 0
	for range 2 {
		lr := <-results
		runs += lr.runs
		total.add(lr.sum)
		if lr.err != nil {
			t.Error(lr.err)
		}
	}
	t.Logf("h2load: %d runs, %d requests done, %d succeeded, %d failed, %d errored, %d timed out; %d 2xx",
		runs, total.done, total.succeeded, total.failed, total.errored, total.timeout, total.status2xx)
	if runs < h2loadReloads {
		t.Errorf("only %d h2load runs across %d reloads: the load proves nothing", runs, h2loadReloads)
	}
	if total.failed != 0 || total.errored != 0 || total.timeout != 0 {
		t.Errorf("%d failed, %d errored, %d timed out of %d requests across %d reloads: want none",
			total.failed, total.errored, total.timeout, total.done, h2loadReloads)
	}
}

// h2loadResult is h2load's summary.
type h2loadResult struct {
	done, succeeded, failed, errored, timeout, status2xx int
}

func (r *h2loadResult) add(o h2loadResult) {
	r.done += o.done
	r.succeeded += o.succeeded
	r.failed += o.failed
	r.errored += o.errored
	r.timeout += o.timeout
	r.status2xx += o.status2xx
}

var (
	h2loadRequests = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatus   = regexp.MustCompile(`status codes: (\d+) 2xx`)
)

func parseH2load(out string) (h2loadResult, error) {
	var r h2loadResult
	m := h2loadRequests.FindStringSubmatch(out)
	s := h2loadStatus.FindStringSubmatch(out)
	if m == nil || s == nil {
		return r, fmt.Errorf("h2load printed no summary")
	}
	n := func(v string) int { i, _ := strconv.Atoi(v); return i }
	r.done, r.succeeded, r.failed, r.errored, r.timeout = n(m[3]), n(m[4]), n(m[5]), n(m[6]), n(m[7])
	r.status2xx = n(s[1])
	return r, nil
}
