package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDockerIndependentContainers: two hotproxy containers on one host,
// both with the image's defaults (base-id 0, its config on 0.0.0.0:8080,
// the restart socket @hotproxy.0.<epoch>, the region
// /dev/shm/hotproxy.0.stats), each with a network namespace of its own
// (--network none: loopback only) and the engine's default private IPC
// namespace. They do not collide: both serve, a reload of one leaves the
// other alone, and each counts only its own requests. Then a third
// container, of another uid, joins the first one's network namespace (where
// its restart socket is) with `supervise --take-over`: it does not get the
// listening sockets, it exits non-zero, and the first container serves on
// with the same generation. Last, two proxies in one network namespace
// (two of one pod): the same base-id is refused with what to do, and each
// with its own base-id serves.
func TestDockerIndependentContainers(t *testing.T) {
	requireRoot(t, "nsenter into a container's network namespace")
	e := requireEngine(t)
	v1, _ := e.images(t)
	a := e.run(t, "indep-a", "--network", "none", v1)
	b := e.run(t, "indep-b", "--network", "none", v1)
	a.waitServing(0, 0, 60*time.Second)
	b.waitServing(0, 0, 60*time.Second)
	if res := a.exec("/usr/local/bin/hotproxy", "reload"); res.Code != 0 || !strings.Contains(res.Stdout, "epoch 1 serves") {
		t.Fatalf("reload in %s: %v", a.name, res)
	}
	stA := a.waitServing(0, 1, 30*time.Second)
	stB := b.waitServing(0, 0, 10*time.Second)
	if stB.Reloads != 0 || len(stB.Generations) != 1 {
		t.Errorf("a reload of %s touched %s: %+v", a.name, b.name, stB)
	}

	aPID, bPID := a.hostPID(), b.hostPID()
	for i := 0; i < 3; i++ {
		if body := inNetns(t, aPID, "http://127.0.0.1:8080/"); !strings.Contains(body, "epoch 1") {
			t.Fatalf("%s answered %q, want its epoch 1", a.name, body)
		}
	}
	for i := 0; i < 5; i++ {
		if body := inNetns(t, bPID, "http://127.0.0.1:8080/"); !strings.Contains(body, "epoch 0") {
			t.Fatalf("%s answered %q, want its epoch 0", b.name, body)
		}
	}
	for _, w := range []struct {
		c    *dockerContainer
		want int
	}{{a, 3}, {b, 5}} {
		expect := fmt.Sprintf("listener.web.downstream_rq_total=%d", w.want)
		if res := w.c.exec("/usr/local/bin/hotproxy", "stats", "--expect", expect); res.Code != 0 {
			t.Errorf("%s counted others' requests, or lost its own: --expect %s: %v", w.c.name, expect, res)
		}
	}

	// The foreign uid, where the restart socket of A's serving generation
	// is: refused (uid check), or, if it starts cold, it cannot bind next
	// to A's sockets (SO_REUSEPORT is per uid). Either way it does not
	// serve and A is untouched.
	servingA, _ := stA.Serving()
	foreignUID := imageUID + 1
	c := e.run(t, "foreign", "--network", "container:"+a.name, "--user", fmt.Sprintf("%d:%d", foreignUID, foreignUID), v1, "--take-over")
	if code := c.wait(60 * time.Second); code == 0 {
		t.Errorf("the foreign-uid container %s exited 0; want a failure", c.name)
	}
	logs := e.do(30*time.Second, "logs", c.name)
	out := logs.Stdout + logs.Stderr
	if !strings.Contains(out, "uid "+strconv.Itoa(foreignUID)) && !strings.Contains(out, "address already in use") {
		t.Errorf("the foreign-uid container's log says neither that its uid was refused nor that the address is in use:\n%s", out)
	}
	stA = a.waitServing(0, servingA.Epoch, 10*time.Second)
	if g, _ := stA.Serving(); g.PID != servingA.PID || stA.Reloads != 1 {
		t.Errorf("%s after the foreign container: serving %+v (want pid %d), %d reloads (want 1)", a.name, g, servingA.PID, stA.Reloads)
	}
	if body := inNetns(t, aPID, "http://127.0.0.1:8080/"); !strings.Contains(body, "epoch 1 pid "+strconv.Itoa(servingA.PID)) {
		t.Errorf("%s answered %q after the foreign container, want epoch 1 pid %d", a.name, body, servingA.PID)
	}

	// A second, independent proxy in A's network namespace (two proxies
	// of one pod), on other ports: with the same base-id its restart
	// socket is taken, and it stops at once saying so, A untouched; with
	// its own base-id both serve.
	other := writeContainerConfig(t, `[admin]
address = "127.0.0.1:9902"

[[listeners]]
name = "other"
address = "127.0.0.1:8081"
protocol = "http"

  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "other epoch %EPOCH%\n" }
`)
	same := e.run(t, "same-base", "--network", "container:"+a.name, "-v", other, v1)
	if code := same.wait(60 * time.Second); code == 0 {
		t.Errorf("a second proxy with base-id 0 in %s's network namespace exited 0; want it refused", a.name)
	}
	if logs := e.do(30*time.Second, "logs", same.name); !strings.Contains(logs.Stdout+logs.Stderr, "another --base-id") {
		t.Errorf("the second proxy with the same base-id does not say to choose another base-id:\n%s%s", logs.Stdout, logs.Stderr)
	}
	own := e.run(t, "own-base", "--network", "container:"+a.name, "-e", "HOTPROXY_BASE_ID=1", "-v", other, v1)
	own.waitServing(1, 0, 60*time.Second)
	if body := inNetns(t, aPID, "http://127.0.0.1:8081/"); body != "other epoch 0\n" {
		t.Errorf("the second proxy (base-id 1) answered %q", body)
	}
	if g, _ := a.waitServing(0, servingA.Epoch, 10*time.Second).Serving(); g.PID != servingA.PID {
		t.Errorf("%s's serving generation changed to %+v next to a second proxy", a.name, g)
	}
}
