package integration

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestDockerSupervisorPID1 runs the image with a real engine, the
// supervisor as the container's PID 1 (--network host, its listener and
// admin API on loopback): the HEALTHCHECK turns healthy; 20 reloads under
// load in keep-alive and connection-per-request modes, alternately
// `docker kill -s HUP` and `docker exec ... hotproxy reload`, fail not one
// request; no zombie is left and the supervisor has exactly its live
// generations as children; a crashed (SIGKILLed) serving generation is
// restarted and serves; `docker stop` drains (a response in flight
// completes) and exits 0 within parent_shutdown_time + 5 s.
func TestDockerSupervisorPID1(t *testing.T) {
	requireRoot(t, "SIGKILL to a generation of the container's uid")
	e := requireEngine(t)
	v1, _ := e.images(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := supervisedProxyConfig(t, backend.Addr)
	const parentShutdown = 3 * time.Second // supervisedProxyConfig's parent_shutdown_time
	base := nextBaseID()
	ct := e.run(t, "pid1", "--network", "host", "--stop-timeout", "60",
		"--health-interval", "1s", "--health-start-period", "1s", "--health-retries", "1",
		"-e", "HOTPROXY_BASE_ID="+strconv.Itoa(base), "-v", writeContainerConfig(t, c.TOML()), v1)
	st := ct.waitServing(base, 0, 60*time.Second)
	if st.PID != 1 {
		t.Fatalf("supervisor pid in its container = %d, want 1", st.PID)
	}
	ct.waitHealth("healthy", 30*time.Second)
	sup := ct.hostPID()

	url := "http://" + c.Listeners[0].Address + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs []*loadgen.Run
	for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
		r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: 4, Duration: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(300, 15*time.Second) {
			t.Fatalf("%v load did not start: %v", mode, r.Snapshot())
		}
		runs = append(runs, r)
	}
	const reloads = 20
	began := time.Now()
	for epoch := 1; epoch <= reloads; epoch++ {
		if epoch%2 == 1 {
			e.must(t, "kill", "-s", "HUP", ct.name)
			ct.waitServing(base, epoch, 30*time.Second)
		} else {
			res := ct.exec("/usr/local/bin/hotproxy", "reload", "--base-id", strconv.Itoa(base))
			if res.Code != 0 || !strings.Contains(res.Stdout, fmt.Sprintf("epoch %d serves", epoch)) {
				t.Fatalf("reload %d through docker exec: %v", epoch, res)
			}
		}
	}
	reloadTime := time.Since(began)
	var answered int64
	for i, r := range runs {
		r.WaitTotal(r.Snapshot().Total()+200, 15*time.Second)
		res := r.Stop()
		answered += res.OK()
		t.Logf("load %d: %v", i, res)
		if res.Failed() != 0 {
			t.Errorf("load %d: %d failed requests over %d reloads: %v", i, res.Failed(), reloads, res)
		}
	}
	t.Logf("%d reloads (HUP and docker exec alternately) in %v, %d requests answered", reloads, reloadTime.Round(time.Millisecond), answered)

	// Every draining generation exits within parent_shutdown_time; then
	// the supervisor has one child, the serving generation, and no zombie.
	deadline := time.Now().Add(parentShutdown + 15*time.Second)
	var zombies, live []int
	for time.Now().Before(deadline) {
		zombies, live = zombieChildren(t, sup)
		if st, err := ct.status(base); err == nil && len(zombies) == 0 && len(live) == 1 && len(st.Generations) == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(zombies) != 0 || len(live) != 1 {
		t.Fatalf("after %d reloads the supervisor (host pid %d) has children %v and zombies %v; want one live child", reloads, sup, live, zombies)
	}

	// A crash: the serving generation is SIGKILLed; the supervisor starts
	// a successor on the same sockets.
	st = ct.waitServing(base, reloads, 10*time.Second)
	g, _ := st.Serving()
	victim := generationHostPID(t, sup, g.PID)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = ct.waitServing(base, -1, 30*time.Second)
	if ng, _ := st.Serving(); ng.Epoch <= g.Epoch {
		t.Fatalf("after SIGKILL of epoch %d, epoch %d serves; want a successor", g.Epoch, ng.Epoch)
	}
	if resp, body := get(t, newClient(10*time.Second), url); resp.StatusCode != 200 || resp.Header.Get(harness.HeaderBackendID) != "b1" {
		t.Fatalf("after the crash: %d %q from backend %q", resp.StatusCode, body, resp.Header.Get(harness.HeaderBackendID))
	}
	deadline = time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if zombies, live = zombieChildren(t, sup); len(zombies) == 0 && len(live) == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(zombies) != 0 {
		t.Errorf("after the crash the supervisor has zombies %v", zombies)
	}

	// docker stop with a response in flight and an idle keep-alive
	// connection open: the response completes (the drain waits for it),
	// the idle connection is closed, and the container exits 0 in time.
	idle, err := net.Dial("tcp", c.Listeners[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := fmt.Fprintf(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	const dripBytes = 20000
	inFlight := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		resp, err := newClient(30 * time.Second).Get(url + "drip?n=" + strconv.Itoa(dripBytes) + "&ms=1500")
		close(started)
		if err != nil {
			inFlight <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			inFlight <- fmt.Errorf("status %d", resp.StatusCode)
			return
		}
		inFlight <- harness.CheckPattern(resp.Body, dripBytes)
	}()
	select {
	case <-started: // the response head is here: the request is in flight
	case <-time.After(10 * time.Second):
		t.Fatal("the /drip request got no response head within 10s")
	}
	start := time.Now()
	e.must(t, "stop", ct.name)
	took := time.Since(start)
	code, _ := strconv.Atoi(ct.inspect("{{.State.ExitCode}}"))
	t.Logf("docker stop took %v, exit code %d", took.Round(time.Millisecond), code)
	if code != 0 {
		t.Errorf("docker stop: exit code %d, want 0", code)
	}
	if limit := parentShutdown + 5*time.Second; took > limit {
		t.Errorf("docker stop took %v, want at most parent_shutdown_time + 5s = %v", took, limit)
	}
	if err := <-inFlight; err != nil {
		t.Errorf("the response in flight at docker stop did not complete: %v", err)
	}
}
