package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// h2DrainTime is the HTTP/2 reload tests' drain_time: longer than the
// long stream (h2LongStream), which must finish on the generation that
// started it.
const (
	h2DrainTime      = 3 * time.Second
	h2LongStream     = 1500 * time.Millisecond
	h2LongStreamSize = 1 << 20
)

// h2ReloadConfig is two http listeners, "h2tls" (TLS, ALPN h2) and "h2c"
// (http2_cleartext), each answering /epoch itself and sending everything
// else to the HTTP/1.1 backend.
func h2ReloadConfig(demo harness.DemoCerts, backend string) harness.Config {
	cfg := restartConfig(h2DrainTime.String(), (h2DrainTime + time.Second).String(), "100ms", backend)
	// A generation drains as long as its longest stream: with a reload
	// every 150 ms, about ten at once while the long one runs. (Only the
	// supervisor hurries generations; this chain has none, and a
	// generation past the bound could not take a slot in the stats.)
	cfg.Extra += "max_draining_generations = 24\n"
	routes := []harness.Route{
		{Path: "/epoch", Status: 200, Body: "%EPOCH%"},
		{Prefix: "/", Cluster: "backend"},
	}
	cfg.Listeners = []harness.Listener{
		{Name: "h2tls", TLS: demo.ListenerTLS(), Routes: routes},
		{Name: "h2c", HTTP2Cleartext: true, Routes: routes},
	}
	return cfg
}

// h2Load is one loadgen run of the storm and the requests it saw finish.
type h2Load struct {
	name string
	run  *loadgen.Run

	mu    sync.Mutex // guards spans
	spans [][2]time.Time
}

// observe keeps the start and end of every request that succeeded.
func (l *h2Load) observe(start, end time.Time, class loadgen.Class) {
	if class != loadgen.ClassOK {
		return
	}
	l.mu.Lock()
	l.spans = append(l.spans, [2]time.Time{start, end})
	l.mu.Unlock()
}

// spanning counts the requests that were in flight at t and completed.
func (l *h2Load) spanning(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.spans {
		if s[0].Before(t) && s[1].After(t) {
			n++
		}
	}
	return n
}

// TestHTTP2ReloadStorm (issue 13): hot restarts every 100 to 200 ms under
// HTTP/2 load, over TLS (ALPN h2) and cleartext (h2c), each client
// multiplexing several streams, on a fast route and on a slow one (50 to
// 200 ms at the backend, so that streams are in flight at every drain):
// no request fails; streams in flight when their generation began to
// drain complete (the slow requests spanning each reload are counted, and
// every reload has some); the servers said GOAWAY before closing every
// connection; each old generation exits 0 within drain_time. Meanwhile one
// long response (1.5 s, a couple of reloads) completes intact on the
// connection, and so the generation, that started it.
func TestHTTP2ReloadStorm(t *testing.T) {
	const reloads = 20
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, h2ReloadConfig(demo, backend.Addr))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var loads []*h2Load
	for _, lst := range []struct{ name, base string }{
		{"h2tls", c.serving.HTTPSURL("h2tls", "")},
		{"h2c", c.serving.URL("h2c", "")},
	} {
		for _, route := range []struct{ name, path string }{
			{"fast", "/"},
			{"slow", "/slow?ms=50&max=200"},
		} {
			l := &h2Load{name: lst.name + " " + route.name}
			r, err := loadgen.Start(ctx, loadgen.Options{
				URL: lst.base + route.path, Mode: loadgen.HTTP2, Clients: 2, Streams: 4,
				Duration: 2 * time.Minute, Timeout: tlsTimeout,
				TLS: clientTLS(t, demo.CA, "a.example.com"), SessionCache: true,
				Check: backendCheck("b1"), Observe: l.observe,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Stop()
			l.run = r
			loads = append(loads, l)
		}
	}
	for _, l := range loads {
		if !l.run.WaitTotal(40, 10*time.Second) {
			t.Fatalf("%s load did not start: %v", l.name, l.run.Snapshot())
		}
		if res := l.run.Snapshot(); res.Failed() != 0 {
			t.Fatalf("%s load fails before any reload: %v", l.name, res)
		}
	}

	// The long stream: on the serving generation, on a connection whose
	// generation is asked first.
	long := startLongStream(t, c.serving.HTTPSURL("h2tls", ""), clientTLS(t, demo.CA, "a.example.com"))

	exited := map[*harness.Generation]*time.Time{}
	var exitMu sync.Mutex // guards the times in exited
	watchExit := func(g *harness.Generation) {
		at := new(time.Time)
		exited[g] = at
		go func() {
			<-g.Done()
			exitMu.Lock()
			*at = time.Now()
			exitMu.Unlock()
		}()
	}
	watchExit(c.serving)
	drainFrom := map[*harness.Generation]time.Time{} // parent → its successor's READY
	var readyAt []time.Time
	start := time.Now()
	next := start
	for i := 1; i <= reloads; i++ {
		// 100, 200, 100, ... ms apart: pacing, not synchronisation.
		next = next.Add(time.Duration(100+100*(i%2)) * time.Millisecond)
		child, parent := c.restart()
		watchExit(child)
		drainFrom[parent] = child.ReadyAt()
		readyAt = append(readyAt, child.ReadyAt())
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
	}
	t.Logf("%d reloads in %v", reloads, time.Since(start).Round(time.Millisecond))

	lr := long.wait(t)
	for _, l := range loads {
		l.run.WaitTotal(l.run.Snapshot().Total()+50, 10*time.Second)
		res := l.run.Stop()
		t.Logf("%s: %v", l.name, res)
		if res.Failed() != 0 {
			t.Errorf("%s: %d failed requests: %v", l.name, res.Failed(), res)
		}
		if res.GoAways == 0 {
			t.Errorf("%s: no GOAWAY in %d reloads: the test proves nothing about draining HTTP/2 (%v)", l.name, reloads, res)
		}
		if res.ClosedWithoutGoAway != 0 {
			t.Errorf("%s: %d connections closed by the proxy without a GOAWAY first: %v", l.name, res.ClosedWithoutGoAway, res)
		}
	}
	// Streams in flight at each drain: the slow loads' requests that
	// spanned the moment the successor said READY (which is when the
	// predecessor is told to drain), and completed.
	for _, l := range loads {
		if !strings.HasSuffix(l.name, "slow") {
			continue
		}
		var counts []string
		for i, at := range readyAt {
			n := l.spanning(at)
			counts = append(counts, fmt.Sprint(n))
			if n == 0 {
				t.Errorf("%s: no completed stream was in flight at reload %d: the test proves nothing there", l.name, i+1)
			}
		}
		t.Logf("%s: completed streams in flight at each reload: %s", l.name, strings.Join(counts, " "))
	}

	// Every old generation exits 0 within drain_time of the drain.
	var slowest time.Duration
	for _, g := range c.gens[:len(c.gens)-1] {
		code, err := g.Wait(exitTimeout)
		if err != nil || code != 0 {
			t.Errorf("epoch %d (pid %d): exit %d, %v\n%s", g.Epoch, g.PID(), code, err, g.Output())
			continue
		}
		exitMu.Lock()
		took := exited[g].Sub(drainFrom[g])
		exitMu.Unlock()
		slowest = max(slowest, took)
		// A little more than drain_time: the process has to exit and
		// be seen to, on a busy machine.
		if took > h2DrainTime+time.Second {
			t.Errorf("epoch %d exited %v after its drain began, want within drain_time (%v)", g.Epoch, took.Round(time.Millisecond), h2DrainTime)
		}
	}

	t.Logf("the old generations exited at most %v after their drain began (drain_time %v)", slowest.Round(time.Millisecond), h2DrainTime)

	// The long stream: whole, on its generation, across reloads.
	if lr.err != nil {
		t.Fatalf("the long stream (epoch %s): %v", lr.epoch, lr.err)
	}
	during := 0
	for _, at := range readyAt {
		if at.After(lr.start) && at.Before(lr.end) {
			during++
		}
	}
	t.Logf("the long stream: %d bytes over %v on epoch %s, %d reloads during it", h2LongStreamSize, lr.end.Sub(lr.start).Round(time.Millisecond), lr.epoch, during)
	if during < 2 {
		t.Errorf("only %d reloads during the long stream, want at least 2: it proves nothing", during)
	}
	var origin *harness.Generation
	for _, g := range c.gens {
		if fmt.Sprint(g.Epoch) == lr.epoch {
			origin = g
		}
	}
	if origin == nil {
		t.Fatalf("the long stream's connection answered epoch %q, which this chain never started", lr.epoch)
	}
	exitMu.Lock()
	originExit := *exited[origin]
	exitMu.Unlock()
	if originExit.IsZero() || originExit.Before(lr.end) {
		t.Errorf("epoch %s exited at %v, before the long stream it served ended (%v)", lr.epoch, originExit, lr.end)
	}
}

// longStream is a long response on an HTTP/2 connection of its own.
type longStream struct {
	done chan struct{}
	res  longResult
}

type longResult struct {
	epoch      string // of the connection it came on
	start, end time.Time
	err        error
}

// startLongStream opens an HTTP/2 connection to base, asks it which epoch
// it is on (GET /epoch), then starts /drip (h2LongStreamSize bytes over
// h2LongStream) on the same connection, and returns at once.
func startLongStream(t *testing.T, base string, tc *tls.Config) *longStream {
	t.Helper()
	tr := &http2.Transport{TLSClientConfig: tc, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	var conns []string
	var mu sync.Mutex // guards conns
	trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		mu.Lock()
		conns = append(conns, ci.Conn.LocalAddr().String())
		mu.Unlock()
	}}
	// Each request is bounded by the time the long one may take.
	ctx, cancel := context.WithTimeout(context.Background(), 3*h2LongStream+tlsTimeout)
	t.Cleanup(cancel)
	do := func(path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		return tr.RoundTrip(req)
	}
	resp, err := do("/epoch")
	if err != nil {
		t.Fatalf("GET /epoch before the long stream: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	epoch := string(b)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /epoch before the long stream: %s %q, %v", resp.Status, epoch, err)
	}
	ls := &longStream{done: make(chan struct{}), res: longResult{epoch: epoch}}
	go func() {
		defer close(ls.done)
		ls.res.start = time.Now()
		resp, err := do(fmt.Sprintf("/drip?n=%d&ms=%d", h2LongStreamSize, h2LongStream.Milliseconds()))
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				err = fmt.Errorf("status %s", resp.Status)
			} else {
				err = harness.CheckPattern(resp.Body, h2LongStreamSize)
			}
		}
		ls.res.end = time.Now()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			ls.res.err = err
		case len(conns) != 2 || conns[0] != conns[1]:
			ls.res.err = fmt.Errorf("came on another connection than GET /epoch (connections %v): its epoch is unknown", conns)
		}
	}()
	return ls
}

func (ls *longStream) wait(t *testing.T) longResult {
	t.Helper()
	select {
	case <-ls.done:
	case <-time.After(3*h2LongStream + tlsTimeout):
		t.Fatalf("the long stream did not end within %v", 3*h2LongStream+tlsTimeout)
	}
	return ls.res
}
