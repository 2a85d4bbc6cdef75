package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/hotproxy/hotproxy/config"
)

func requireLinux(tb testing.TB) {
	tb.Helper()
	if runtime.GOOS != "linux" {
		tb.Skip("SO_REUSEPORT per-worker sockets are Linux-only")
	}
}

func directConfig(body string) *config.Config {
	return &config.Config{Listeners: []config.Listener{httpListener("web",
		config.Route{Prefix: "/", DirectResponse: &config.DirectResponse{Status: 200, Body: body}})}}
}

func TestReusePortSpreads(t *testing.T) {
	requireLinux(t)
	m := startManager(t, directConfig("ok"), 2)
	ml := m.listeners[0]
	if len(ml.sockets) != 2 || ml.sockets[0].owner != 0 || ml.sockets[1].owner != 1 {
		t.Fatalf("want one socket per worker, got %d", len(ml.sockets))
	}
	if portOf(ml.sockets[0].ln) != portOf(ml.sockets[1].ln) {
		t.Fatalf("port 0: workers on different ports %s, %s", ml.sockets[0].ln.Addr(), ml.sockets[1].ln.Addr())
	}
	a := addr(t, m, "web")
	for range 200 {
		// A fresh connection (fresh source port) per request.
		if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	w0, w1 := counter(m, "worker.0."+statCxTotal), counter(m, "worker.1."+statCxTotal)
	if w0 == 0 || w1 == 0 || w0+w1 != 200 || lstat(m, statCxTotal) != 200 {
		t.Fatalf("connections per worker: %d, %d (listener total %d)", w0, w1, lstat(m, statCxTotal))
	}
	t.Logf("connections per worker: %d, %d", w0, w1)
}

func TestSharedSocket(t *testing.T) {
	cfg := directConfig("shared")
	cfg.Server.ReusePort = boolp(false)
	m := startManager(t, cfg, 2)
	if s := m.listeners[0].sockets; len(s) != 1 || s[0].key.Worker != -1 {
		t.Fatalf("want one shared socket, got %+v", s)
	}
	a := addr(t, m, "web")
	for range 50 {
		if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if got := lstat(m, statCxTotal); got != 50 {
		t.Fatalf("%d connections counted", got)
	}
}

// TestInheritedSockets: the seam of the hot restart. A second Manager
// serves on the sockets of the first, passed as files.
func TestInheritedSockets(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		t.Run(fmt.Sprintf("reuse_port=%v", reuse), func(t *testing.T) {
			if reuse {
				requireLinux(t)
			}
			cfg1 := directConfig("first")
			cfg1.Server.ReusePort = boolp(reuse)
			m1 := startManager(t, cfg1, 2)
			a := addr(t, m1, "web")
			if resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
				t.Fatal(resp.StatusCode)
			}
			files, err := m1.Sockets()
			if err != nil {
				t.Fatal(err)
			}
			// A socket for an address the new config does not have.
			stray, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			sf, _ := stray.(*net.TCPListener).File()
			stray.Close()
			strayKey := SocketKey{"tcp", "127.0.0.1:1", 0}
			files[strayKey] = sf
			nfiles := len(files)

			// The second generation: same listener, new body.
			cfg2 := directConfig("second")
			cfg2.Server.ReusePort = boolp(reuse)
			cfg2.SetDefaults()
			snap, err := BuildSnapshotN(cfg2, Identity{}, 2)
			if err != nil {
				t.Fatal(err)
			}
			m2, err := New(Options{Concurrency: 2, Inherited: files, Logger: testLogger()}, snap)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m2.Close() })
			if got := len(m2.listeners[0].sockets); got != nfiles-1 {
				t.Fatalf("adopted %d sockets, want %d", got, nfiles-1)
			}
			unused := m2.Unused()
			if len(unused) != 1 || unused[strayKey] != sf {
				t.Fatalf("Unused = %v", unused)
			}
			sf.Close()
			m2.Start()
			// The old generation goes; the sockets stay (the new one
			// holds them) and every new connection reaches m2.
			if err := m1.Drain(ctxTimeout(t, 5e9), DrainOptions{}); err != nil {
				t.Fatal(err)
			}
			for range 20 {
				c, err := net.Dial("tcp", a)
				if err != nil {
					t.Fatalf("after hand-over: %v", err)
				}
				c.Close()
			}
			for range 20 {
				resp := rawRequest(t, a, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
				if resp.StatusCode != 200 {
					t.Fatal(resp.StatusCode)
				}
			}
			if got := lstat(m2, "downstream_rq_2xx"); got != 20 {
				t.Fatalf("m2 served %d requests, want 20", got)
			}
		})
	}
}

func TestBindErrors(t *testing.T) {
	t.Run("plain listener", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		for _, reuse := range []bool{true, false} {
			testBindInUse(t, ln.Addr().String(), reuse)
		}
	})
	t.Run("reuseport listener of another socket", func(t *testing.T) {
		requireLinux(t)
		// As another process of the same uid would: its own
		// SO_REUSEPORT socket. Without the probe, we would join its
		// group silently.
		ln, err := (&net.ListenConfig{Control: reusePortControl}).Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		testBindInUse(t, ln.Addr().String(), true)
	})
	t.Run("second listener, same address", func(t *testing.T) {
		// The first listener is bound by then: the error must come
		// from the second and nothing may stay bound.
		port := deadPort(t)
		cfg := directConfig("x")
		cfg.Listeners[0].Address = port
		l2 := cfg.Listeners[0]
		l2.Name = "web2"
		cfg.Listeners = append(cfg.Listeners, l2)
		// config refuses two listeners on one address; New must still
		// clean up when the second bind fails (an address taken between
		// validate and serve), so the snapshot is compiled unchecked.
		cfg.SetDefaults()
		snap, err := compileSnapshot(cfg, Identity{}, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(Options{Concurrency: 2}, snap)
		if m != nil {
			m.Close()
		}
		if err == nil || !strings.Contains(err.Error(), `listener "web2"`) {
			t.Fatalf("err = %v", err)
		}
		ln, err := net.Listen("tcp", port)
		if err != nil {
			t.Fatalf("address still bound after a failed New: %v", err)
		}
		ln.Close()
	})
	t.Run("messages", func(t *testing.T) {
		for _, tc := range []struct {
			errno syscall.Errno
			want  string
		}{
			{syscall.EADDRINUSE, `listener "web": address "0.0.0.0:80": bind: address already in use (another process is listening there; stop it or choose another address)`},
			{syscall.EACCES, `listener "web": address "0.0.0.0:80": bind: permission denied (run as root or grant CAP_NET_BIND_SERVICE)`},
		} {
			err := &BindError{Listener: "web", Address: "0.0.0.0:80", Err: &net.OpError{Op: "listen", Net: "tcp", Err: os.NewSyscallError("bind", tc.errno)}}
			if err.Error() != tc.want {
				t.Errorf("got  %s\nwant %s", err, tc.want)
			}
			if !errors.Is(err, tc.errno) {
				t.Errorf("%v does not wrap %v", err, tc.errno)
			}
		}
	})
}

func newManagerErr(cfg *config.Config) (*Manager, error) {
	cfg.SetDefaults()
	snap, err := BuildSnapshotN(cfg, Identity{}, 2)
	if err != nil {
		return nil, err
	}
	m, err := New(Options{Concurrency: 2}, snap)
	if m != nil {
		m.Close()
	}
	return m, err
}

func testBindInUse(t *testing.T, address string, reuse bool) {
	t.Helper()
	cfg := directConfig("x")
	cfg.Listeners[0].Address = address
	cfg.Server.ReusePort = boolp(reuse)
	_, err := newManagerErr(cfg)
	want := fmt.Sprintf(`listener "web": address %q: bind: address already in use (another process is listening there; stop it or choose another address)`, address)
	if err == nil || err.Error() != want {
		t.Fatalf("reuse_port=%v: err = %v\nwant %s", reuse, err, want)
	}
	var be *BindError
	if !errors.As(err, &be) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("not a BindError wrapping EADDRINUSE: %#v", err)
	}
}
