package workers

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

func tcpConfig(backend string, idle time.Duration) *config.Config {
	l := tcpListener("tcp", "backend")
	l.IdleTimeout = dur(idle)
	return &config.Config{
		Listeners: []config.Listener{l},
		Clusters:  []config.Cluster{cluster("backend", backend)},
	}
}

func dialTCP(tb testing.TB, addr string) *net.TCPConn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn)
}

func TestTCPHalfClose(t *testing.T) {
	// The backend answers only after the client's EOF: the client's
	// half-close must reach it while the other direction stays open.
	be := rawBackend(t, func(c net.Conn) {
		b, err := io.ReadAll(c)
		if err != nil {
			return
		}
		c.Write([]byte("got:"))
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
	})
	m := startManager(t, tcpConfig(be, 0), 1)
	c := dialTCP(t, addr(t, m, "tcp"))
	if _, err := c.Write([]byte("hello, upstream")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got:hello, upstream" {
		t.Fatalf("got %q %v", got, err)
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
	cx, rx, tx, destroy := lstat(m, statCxTotal), lstat(m, statRxBytes), lstat(m, statTxBytes), lstat(m, statCxDestroy)
	if cx != 1 || rx != 15 || tx != 19 || destroy != 1 {
		t.Fatalf("cx_total %d rx %d tx %d cx_destroy %d, want 1 15 19 1", cx, rx, tx, destroy)
	}
	if n := counter(m, "worker.0."+statCxTotal); n != 1 {
		t.Fatalf("worker.0.downstream_cx_total %d, want 1", n)
	}
	if n := counter(m, "cluster.backend.upstream_cx_total"); n != 1 {
		t.Fatalf("cluster.backend.upstream_cx_total %d, want 1", n)
	}
	waitFor(t, 5*time.Second, "upstream_cx_active to reach 0", func() bool { return gauge(m, "cluster.backend.upstream_cx_active") == 0 })
}

func TestTCPLargeTransfer(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
	m := startManager(t, tcpConfig(be, 0), 2)
	c := dialTCP(t, addr(t, m, "tcp"))
	want := make([]byte, 8<<20)
	rand.Read(want)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d (or contents differ)", len(got), len(want))
	}
}

func TestTCPConnectFailureClosesClient(t *testing.T) {
	m := startManager(t, tcpConfig(deadPort(t), 0), 1)
	c := dialTCP(t, addr(t, m, "tcp"))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read succeeded on a connection with no upstream")
	}
}

func TestTCPIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	// The backend talks for a while (one direction busy, the other
	// silent), then stops; only then may the pair be closed as idle.
	be := rawBackend(t, func(c net.Conn) {
		for range 8 {
			if _, err := c.Write([]byte("tick\n")); err != nil {
				return
			}
			time.Sleep(idle / 3)
		}
		io.Copy(io.Discard, c) // silent until closed
	})
	m := startManager(t, tcpConfig(be, idle), 1)
	c := dialTCP(t, addr(t, m, "tcp"))
	start := time.Now()
	got, err := io.ReadAll(c) // ends when the proxy closes the idle pair
	// EOF or a reset: what matters is that it ended before the deadline.
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle pair not closed: %v", err)
	}
	if string(got) != string(bytes.Repeat([]byte("tick\n"), 8)) {
		t.Fatalf("a busy direction was cut: got %q", got)
	}
	if d := time.Since(start); d < 8*idle/3 || d > 8*idle/3+5*time.Second {
		t.Fatalf("closed after %v", d)
	}
	waitFor(t, 5*time.Second, "the session to end", func() bool { return cxActive(m) == 0 })
}
