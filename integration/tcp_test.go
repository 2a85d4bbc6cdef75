package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

func tcpProxyConfig(endpoints ...string) harness.Config {
	return harness.Config{
		Concurrency: testConcurrency,
		DrainTime:   "5s",
		Listeners:   []harness.Listener{{Name: "tcp", Protocol: "tcp", Cluster: "echo"}},
		Clusters:    []harness.Cluster{{Name: "echo", Endpoints: endpoints, ConnectTimeout: "1s"}},
	}
}

// echoThrough sends n bytes of the pattern through addr, half-closes, and
// checks that exactly the same bytes come back followed by EOF.
func echoThrough(addr string, n int64, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	werr := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, harness.PatternReader(n))
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	rerr := harness.CheckPattern(c, n)
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if rerr != nil {
		return fmt.Errorf("echo: %w", rerr)
	}
	return nil
}

// TestTCPByteExactHalfClose streams 32 MiB each way on several concurrent
// connections through a tcp listener to an echo backend that answers the
// client's half-close with its own: every byte comes back, then EOF.
func TestTCPByteExactHalfClose(t *testing.T) {
	t.Parallel()
	b := harness.StartTCPEchoBackend(t)
	p := harness.Start(t, tcpProxyConfig(b.Addr))
	addr := p.Addr("tcp")

	t.Run("small", func(t *testing.T) {
		if err := echoThrough(addr, 5, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("32MiB x3 concurrent", func(t *testing.T) {
		const conns, size = 3, 32 << 20
		var wg sync.WaitGroup
		errs := make([]error, conns)
		for i := 0; i < conns; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = echoThrough(addr, size, 90*time.Second)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("many small concurrent", func(t *testing.T) {
		const conns = 32
		var wg sync.WaitGroup
		errs := make([]error, conns)
		for i := 0; i < conns; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = echoThrough(addr, int64(1000+i*4093), 20*time.Second)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	if code := p.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}
