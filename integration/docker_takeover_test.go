package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestDockerTakeOverBetweenContainers is the sidecar hot upgrade with a
// real engine: container A (image tag v1) serves; container B (tag v2)
// joins A's network namespace and shares its stats region, and its
// `supervise --take-over` takes over A's listening sockets; A's generation
// drains, A exits 0, B serves. Under load in keep-alive and
// connection-per-request modes, not one request fails, and the request
// counter carries on across the containers (every request counted once).
//
// Three ways of sharing: the IPC namespace (`--ipc container:A`, A being
// `--ipc shareable`), one upgrade; a tmpfs volume mounted at /dev/shm in
// every container, which also makes the way back work (B to a new A,
// joining B): Docker gives a container that joins another's IPC namespace
// the /dev/shm of the container that owns it, and that one is gone after
// the first upgrade; and a pod: a pause container owns the network and IPC
// namespaces, and A, B and the new A join it (Kubernetes, the Compose
// recipe of docs/containers.md).
func TestDockerTakeOverBetweenContainers(t *testing.T) {
	for _, tc := range []struct {
		name string
		// upgrades is how many hand-overs: A to B, then B to a new A.
		upgrades int
		// sharing: how the containers share the network namespace and
		// the region.
		sharing string
	}{
		{"ipc-namespace", 1, "ipc"},
		{"shm-volume", 2, "volume"},
		{"pod", 2, "pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := requireEngine(t)
			v1, v2 := e.images(t)
			backend := harness.StartHTTPBackend(t, "b1")
			c := supervisedProxyConfig(t, backend.Addr)
			base := nextBaseID()
			cfg := writeContainerConfig(t, c.TOML())
			common := []string{"--stop-timeout", "60", "-e", "HOTPROXY_BASE_ID=" + strconv.Itoa(base), "-v", cfg}
			var shm []string
			var pod *dockerContainer
			switch tc.sharing {
			case "volume":
				vol := fmt.Sprintf("hpit-%d-%d-shm", base, time.Now().UnixNano())
				e.must(t, "volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs", "--opt", "o=size=64m,mode=1777", vol)
				t.Cleanup(func() { e.do(time.Minute, "volume", "rm", "-f", vol) })
				shm = []string{"-v", vol + ":/dev/shm"}
			case "pod":
				// A pod's pause container: it owns the network and IPC
				// namespaces (and /dev/shm), and outlives every slot.
				pod = e.run(t, "pod", "--network", "host", "--ipc", "shareable", e.pauseImage(t))
			}
			// joined are the arguments of a container that shares with cur.
			joined := func(cur *dockerContainer) []string {
				switch tc.sharing {
				case "volume":
					return append([]string{"--network", "container:" + cur.name}, shm...)
				case "pod":
					return []string{"--network", "container:" + pod.name, "--ipc", "container:" + pod.name}
				}
				return []string{"--network", "container:" + cur.name, "--ipc", "container:" + cur.name}
			}

			var args []string
			switch tc.sharing {
			case "volume":
				args = append([]string{"--network", "host"}, shm...)
			case "pod":
				args = joined(nil)
			default:
				args = []string{"--network", "host", "--ipc", "shareable"}
			}
			args = append(args, common...)
			cur := e.run(t, "a", append(args, v1, "--take-over")...)
			cur.waitServing(base, 0, 60*time.Second)

			url := "http://" + c.Listeners[0].Address + "/"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var runs []*loadgen.Run
			const clients = 4
			for _, mode := range []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest} {
				r, err := loadgen.Start(ctx, loadgen.Options{URL: url, Mode: mode, Clients: clients, Duration: 5 * time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				defer r.Stop()
				if !r.WaitTotal(300, 15*time.Second) {
					t.Fatalf("%v load did not start: %v", mode, r.Snapshot())
				}
				runs = append(runs, r)
			}
			before, err := adminCounter(c.Admin, "listener.web.downstream_rq_total")
			if err != nil {
				t.Fatal(err)
			}

			images := []string{v2, v1}
			for up := 1; up <= tc.upgrades; up++ {
				args := append(joined(cur), common...)
				role := []string{"b", "a2"}[up-1]
				start := time.Now()
				next := e.run(t, role, append(args, images[up-1], "--take-over")...)
				st := next.waitServing(base, up, 60*time.Second)
				if g, _ := st.Serving(); g.Epoch != up {
					t.Fatalf("upgrade %d: container %s serves epoch %d, want %d", up, next.name, g.Epoch, up)
				}
				if code := cur.wait(30 * time.Second); code != 0 {
					t.Errorf("upgrade %d: container %s exited %d after handing over, want 0", up, cur.name, code)
				}
				t.Logf("upgrade %d (%s to %s): the new container served and the old one exited in %v", up, cur.name, next.name, time.Since(start).Round(time.Millisecond))
				// Load through the new container alone.
				for _, r := range runs {
					if !r.WaitTotal(r.Snapshot().Total()+200, 15*time.Second) {
						t.Fatalf("upgrade %d: load stalled: %v", up, r.Snapshot())
					}
				}
				cur = next
			}

			var total int64
			for i, r := range runs {
				res := r.Stop()
				total += res.OK()
				t.Logf("load %d: %v", i, res)
				if res.Failed() != 0 {
					t.Errorf("load %d: %d failed requests over %d hand-overs between containers: %v", i, res.Failed(), tc.upgrades, res)
				}
			}
			// Counted once each, by one container's generation or the
			// other's; a request in flight when its load run stopped may be
			// counted by the proxy and not by the load generator: at most
			// one per client.
			maxCount := uint64(total + 2*clients)
			deadline := time.Now().Add(15 * time.Second)
			var after uint64
			for time.Now().Before(deadline) {
				if after, err = adminCounter(c.Admin, "listener.web.downstream_rq_total"); err == nil && after >= uint64(total) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("listener.web.downstream_rq_total: %d before the first hand-over, %d at the end; %d requests answered", before, after, total)
			if before == 0 || after < uint64(total) || after > maxCount {
				t.Errorf("listener.web.downstream_rq_total = %d after %d hand-overs (%d before), want %d (every request) to %d (and those in flight at the end): the counters did not carry over", after, tc.upgrades, before, total, maxCount)
			}
			if res := cur.exec("/usr/local/bin/hotproxy", "stats", "--expect", "server.live=1"); res.Code != 0 {
				t.Errorf("in %s after the hand-overs, the health check fails: %v", cur.name, res)
			}
			if !strings.HasPrefix(cur.inspect("{{.Config.Image}}"), testImageRepo) {
				t.Errorf("serving container %s runs %s", cur.name, cur.inspect("{{.Config.Image}}"))
			}
		})
	}
}
