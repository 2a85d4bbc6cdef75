package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

func TestNewClusterErrors(t *testing.T) {
	tests := []struct {
		name string
		spec config.Cluster
		want []string // substrings of the error
	}{
		{"no endpoints", config.Cluster{Name: "backend"},
			[]string{`cluster "backend"`, "no endpoints"}},
		{"missing port", config.Cluster{Name: "backend", Endpoints: []string{"127.0.0.1"}},
			[]string{`cluster "backend"`, `endpoint "127.0.0.1"`, "host:port"}},
		{"port out of range", config.Cluster{Name: "backend", Endpoints: []string{"127.0.0.1:99999"}},
			[]string{`endpoint "127.0.0.1:99999"`, `bad port "99999"`}},
		{"port zero", config.Cluster{Name: "backend", Endpoints: []string{"127.0.0.1:0"}},
			[]string{`endpoint "127.0.0.1:0"`, `bad port "0"`}},
		{"port not a number", config.Cluster{Name: "backend", Endpoints: []string{"127.0.0.1:http"}},
			[]string{`bad port "http"`}},
		{"missing host", config.Cluster{Name: "backend", Endpoints: []string{":80"}},
			[]string{`endpoint ":80"`, "missing host"}},
		{"unknown policy", config.Cluster{Name: "backend", LBPolicy: "fastest", Endpoints: []string{"127.0.0.1:80"}},
			[]string{`cluster "backend"`, `unknown lb_policy "fastest"`, "round_robin", "least_request", "random"}},
		{"unresolvable", config.Cluster{Name: "backend", Endpoints: []string{"127.0.0.1:80", "nosuch.onion:80"}},
			[]string{`cluster "backend": endpoint "nosuch.onion:80": cannot resolve host "nosuch.onion": `}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCluster(tt.spec)
			if err == nil {
				t.Fatalf("NewCluster succeeded (%+v), want an error", c)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNewClusterDefaultsAndResolution(t *testing.T) {
	c, err := NewCluster(config.Cluster{
		Name:      "backend",
		Endpoints: []string{"127.0.0.1:8080", "localhost:8081", "[::1]:8082", "[::ffff:10.0.0.1]:8083"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// localhost is 127.0.0.1 where it has an IPv4 address at all.
	localhost := "127.0.0.1:8081"
	if ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip4", "localhost"); err != nil || len(ips) == 0 {
		localhost = "[::1]:8081"
	}
	want := []Endpoint{{"127.0.0.1:8080"}, {localhost}, {"[::1]:8082"}, {"10.0.0.1:8083"}}
	if len(c.Endpoints) != len(want) {
		t.Fatalf("endpoints %v, want %v", c.Endpoints, want)
	}
	for i := range want {
		if c.Endpoints[i] != want[i] {
			t.Errorf("endpoint %d: %q, want %q", i, c.Endpoints[i].Address, want[i].Address)
		}
	}
	// Every value is taken as given: config fills in the defaults (one
	// home for them), and 0 means what it says.
	if c.policy != config.LBRoundRobin || c.connectTimeout != 0 ||
		c.idleTimeout != 0 || c.maxIdle != 0 {
		t.Errorf("values not taken as given: policy %q connect %v idle %v maxIdle %d",
			c.policy, c.connectTimeout, c.idleTimeout, c.maxIdle)
	}

	c, err = NewCluster(config.Cluster{
		Name:               "backend",
		LBPolicy:           config.LBLeastRequest,
		Endpoints:          []string{"127.0.0.1:8080"},
		ConnectTimeout:     config.Duration(time.Second),
		IdleTimeout:        config.Duration(2 * time.Second),
		MaxIdlePerEndpoint: new(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.policy != config.LBLeastRequest || c.connectTimeout != time.Second || c.idleTimeout != 2*time.Second || c.maxIdle != 3 {
		t.Errorf("spec values not kept: policy %q connect %v idle %v maxIdle %d",
			c.policy, c.connectTimeout, c.idleTimeout, c.maxIdle)
	}
	wc := c.ForWorker(0)
	if wc.maxIdle != 3 || wc.idleTimeout != 2*time.Second {
		t.Errorf("pool settings not from the spec: maxIdle %d idle %v", wc.maxIdle, wc.idleTimeout)
	}
}

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	bs := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	wc := newWorkerCluster(t, config.Cluster{Endpoints: addrs(bs...)}, 0)
	got := map[string]int{}
	for range 30 {
		got[get(t, wc)]++
	}
	for _, b := range bs {
		if got[b.name] != 10 {
			t.Errorf("backend %s got %d of 30 requests, want 10 (all: %v)", b.name, got[b.name], got)
		}
	}
}

func TestRoundRobinWorkerOffset(t *testing.T) {
	c := &Cluster{Name: "backend", Endpoints: []Endpoint{{"127.0.0.1:1"}, {"127.0.0.1:2"}, {"127.0.0.1:3"}}}
	for w := range 5 {
		if got, want := c.ForWorker(w).bal.pick(allEndpoints(3), 0), w%3; got != want {
			t.Errorf("worker %d starts at endpoint %d, want %d", w, got, want)
		}
	}
}

func TestRandomHitsAllEndpoints(t *testing.T) {
	bs := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	wc := newWorkerCluster(t, config.Cluster{LBPolicy: config.LBRandom, Endpoints: addrs(bs...)}, 0)
	got := map[string]int{}
	// The chance that 300 draws miss one of three endpoints is 3*(2/3)^300.
	for i := 0; i < 300 && len(got) < len(bs); i++ {
		got[get(t, wc)]++
	}
	if len(got) != len(bs) {
		t.Errorf("random reached %v, want all of a, b, c", got)
	}
}

func TestLeastRequestPrefersIdleEndpoints(t *testing.T) {
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-release
		io.WriteString(w, "slow")
	})
	// Registered after the server, so it runs first: the server's Close
	// waits for the held handler.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	b, c := newBackend(t, "b", nil), newBackend(t, "c", nil)
	wc := newWorkerCluster(t, config.Cluster{LBPolicy: config.LBLeastRequest, Endpoints: addrs(slow, b, c)}, 0)

	// Send requests one at a time until one is held open on slow. Ties
	// are broken at random, so each request has a 1/3 chance.
	heldDone := make(chan string, 1)
	for i := 0; ; i++ {
		if i == 300 {
			t.Fatal("no request reached the slow backend in 300 tries")
		}
		res := make(chan string, 1)
		go func() { res <- get(t, wc) }()
		var isHeld bool
		select {
		case <-held:
			isHeld = true
			go func() { heldDone <- <-res }()
		case name := <-res:
			if name == "slow" {
				t.Fatal("slow answered without being released")
			}
		}
		if isHeld {
			break
		}
	}

	lr := wc.bal.(*leastRequest)
	if n := lr.active[0].n.Load(); n != 1 {
		t.Fatalf("slow endpoint has %d active requests, want 1", n)
	}
	got := map[string]int{}
	for range 30 {
		got[get(t, wc)]++
	}
	if got["slow"] != 0 || got["b"]+got["c"] != 30 {
		t.Errorf("with slow busy, requests went %v; want none to slow", got)
	}

	releaseOnce.Do(func() { close(release) })
	if name := <-heldDone; name != "slow" {
		t.Errorf("held request answered by %q", name)
	}
	for i := range lr.active {
		if n := lr.active[i].n.Load(); n != 0 {
			t.Errorf("endpoint %d still counts %d active requests after all bodies closed", i, n)
		}
	}
}

func TestDialTCPFallsThrough(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()

	down := closedAddr(t)
	wc := newWorkerCluster(t, config.Cluster{LBPolicy: config.LBLeastRequest, Endpoints: []string{down, ln.Addr().String()}}, 0)
	// least_request picks at random; force the first try onto the dead
	// endpoint by making the live one look busier.
	lr := wc.bal.(*leastRequest)
	lr.active[1].n.Add(5)
	conn, ep, done, err := wc.DialTCP(context.Background())
	if err != nil {
		t.Fatalf("DialTCP: %v", err)
	}
	defer conn.Close()
	if ep != ln.Addr().String() {
		t.Errorf("endpoint %q, want %q", ep, ln.Addr())
	}
	srv := <-accepted
	defer srv.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}

	if n := lr.active[1].n.Load(); n != 6 {
		t.Errorf("live endpoint counts %d active, want 6", n)
	}
	if n := lr.active[0].n.Load(); n != 0 {
		t.Errorf("dead endpoint counts %d active, want 0", n)
	}
	done()
	done() // idempotent
	if n := lr.active[1].n.Load(); n != 5 {
		t.Errorf("after done, live endpoint counts %d active, want 5", n)
	}
}

func TestAllEndpointsDown(t *testing.T) {
	down := []string{closedAddr(t), closedAddr(t)}
	const timeout = 10 * time.Second
	wc := newWorkerCluster(t, config.Cluster{Endpoints: down, ConnectTimeout: config.Duration(timeout)}, 0)

	check := func(t *testing.T, err error, elapsed time.Duration) {
		t.Helper()
		var ce *ConnectError
		if !errors.As(err, &ce) {
			t.Fatalf("error %v (%T), want *ConnectError", err, err)
		}
		if ce.Cluster != "backend" || len(ce.Tried) != 2 || ce.Err == nil {
			t.Errorf("ConnectError %+v, want cluster backend, 2 tried, an error", ce)
		}
		for _, a := range down {
			if !strings.Contains(err.Error(), a) {
				t.Errorf("error %q does not name endpoint %s", err, a)
			}
		}
		if !strings.Contains(err.Error(), `cluster "backend"`) {
			t.Errorf("error %q does not name the cluster", err)
		}
		// Refused connections fail at once; waiting for the connect
		// timeout would mean an endpoint was not given up on.
		if elapsed >= timeout {
			t.Errorf("took %v, the whole connect timeout", elapsed)
		}
	}

	t.Run("DialTCP", func(t *testing.T) {
		start := time.Now()
		conn, _, _, err := wc.DialTCP(context.Background())
		if conn != nil {
			conn.Close()
		}
		check(t, err, time.Since(start))
	})
	t.Run("Acquire", func(t *testing.T) {
		start := time.Now()
		c, err := wc.Acquire(context.Background())
		if c != nil {
			c.Discard()
		}
		check(t, err, time.Since(start))
	})
}

func TestAcquireFallsThroughToALiveEndpoint(t *testing.T) {
	live := newBackend(t, "live", nil)
	// Worker 0's round robin starts at endpoint 0: the dead one.
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{closedAddr(t), live.addr()}}, 0)
	if got := get(t, wc); got != "live" {
		t.Fatalf("answered by %q, want live", got)
	}
}

func TestNoEndpointIsAnError(t *testing.T) {
	wc := (&Cluster{Name: "empty"}).ForWorker(0)
	if _, _, _, err := wc.DialTCP(context.Background()); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("DialTCP: %v, want ErrNoEndpoint", err)
	}
	if _, err := wc.Acquire(context.Background()); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("Acquire: %v, want ErrNoEndpoint", err)
	}
	var zero WorkerCluster
	if _, err := zero.Acquire(context.Background()); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("zero WorkerCluster Acquire: %v, want ErrNoEndpoint", err)
	}
	zero.CloseIdle()
}

func TestKeepAliveReuse(t *testing.T) {
	bs := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil)}
	wc := newWorkerCluster(t, config.Cluster{Endpoints: addrs(bs...), MaxIdlePerEndpoint: new(4)}, 0)
	for range 20 {
		get(t, wc)
	}
	for _, b := range bs {
		if n, hits := b.newConns.Load(), b.hits.Load(); n != 1 || hits != 10 {
			t.Errorf("backend %s: %d connections for %d requests, want 1 for 10", b.name, n, hits)
		}
	}
	if n := wc.IdleConns(); n != 2 {
		t.Errorf("%d idle connections pooled, want 2", n)
	}
	wc.CloseIdle()
	if n := wc.IdleConns(); n != 0 {
		t.Errorf("%d idle connections after CloseIdle, want 0", n)
	}
	// A retired view pools nothing: a connection given back is closed.
	get(t, wc)
	if n := wc.IdleConns(); n != 0 {
		t.Errorf("a retired view pooled %d connections", n)
	}
}

// max_idle_per_endpoint = 0 keeps no idle connection: every request dials.
func TestMaxIdleZeroKeepsNone(t *testing.T) {
	b := newBackend(t, "a", nil)
	c, err := NewCluster(config.Cluster{Name: "backend", Endpoints: []string{b.addr()}, MaxIdlePerEndpoint: new(0)})
	if err != nil {
		t.Fatal(err)
	}
	wc := c.ForWorker(0)
	for range 5 {
		get(t, wc)
	}
	if n := b.newConns.Load(); n != 5 {
		t.Errorf("%d connections for 5 requests with max_idle_per_endpoint = 0, want 5", n)
	}
	if n := wc.IdleConns(); n != 0 {
		t.Errorf("%d idle connections kept, want 0", n)
	}
}

// A pooled connection idle longer than idle_timeout is not handed out.
func TestIdleTimeoutAgesConnectionsOut(t *testing.T) {
	b := newBackend(t, "a", nil)
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{b.addr()}, MaxIdlePerEndpoint: new(4), IdleTimeout: config.Duration(time.Nanosecond)}, 0)
	get(t, wc)
	get(t, wc)
	if n := b.newConns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the pooled one was older than idle_timeout", n)
	}
}

func TestAcquireContextCanceled(t *testing.T) {
	b := newBackend(t, "a", nil)
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{b.addr()}}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := wc.Acquire(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with a canceled context: %v, want context.Canceled", err)
	}
}

func TestConnectErrorMessage(t *testing.T) {
	err := &ConnectError{Cluster: "backend", Tried: []string{"10.0.0.1:80", "10.0.0.2:80"}, Err: errors.New("connection refused")}
	want := `cluster "backend": could not connect to any endpoint (tried 10.0.0.1:80, 10.0.0.2:80): connection refused`
	if err.Error() != want {
		t.Errorf("got  %q\nwant %q", err.Error(), want)
	}
}
