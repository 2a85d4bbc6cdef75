package harness

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that nothing listened on a moment
// ago: it binds 127.0.0.1:0, records the port and closes the socket. Another
// process may take the port in between; StartProxyFunc retries once on
// "address already in use" for that reason. It never returns a port it
// returned before in this process: the kernel may hand the port it just
// freed to the next bind, and a config given the same port for its admin
// API and a listener is refused (TestHTTP2ALPN failed so once on CI).
func FreePort(tb testing.TB) int {
	tb.Helper()
	for range 100 {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("free port: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if err := ln.Close(); err != nil {
			tb.Fatalf("free port: close: %v", err)
		}
		givenPorts.Lock()
		_, again := givenPorts.seen[port]
		givenPorts.seen[port] = struct{}{}
		givenPorts.Unlock()
		if !again {
			return port
		}
	}
	tb.Fatal("free port: 100 binds in a row got ports handed out before")
	return 0
}

// givenPorts are the ports FreePort has returned in this process.
var givenPorts = struct {
	sync.Mutex
	seen map[int]struct{}
}{seen: map[int]struct{}{}}

// FreeAddr returns "127.0.0.1:PORT" for a FreePort.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}

// ClosedAddr returns a loopback address with nothing listening on it: a
// connection to it is refused. It is a FreeAddr under a name that says what
// the test means.
func ClosedAddr(tb testing.TB) string {
	tb.Helper()
	return FreeAddr(tb)
}

// HoldPort listens on a free loopback port and keeps it until the test ends;
// it returns the address. Use it to provoke a bind failure.
func HoldPort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("hold port: %v", err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// PortFree reports whether addr can be listened on right now.
func PortFree(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
