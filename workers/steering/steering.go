// Package steering picks which SO_REUSEPORT socket of a listener takes each
// new connection, with an eBPF program of type SK_REUSEPORT attached as
// BPF_SK_REUSEPORT_SELECT_OR_MIGRATE: the worker with the fewest active
// connections (least_conn) or one chosen by the flow hash (hash). The same
// program runs when a socket of the group closes and moves the
// connections queued or half-open in it to a live socket of the group
// (Linux 5.14), so a socket can be closed without resetting anyone. It
// also refuses new connections, counted, for a generation that stops for
// good (RefuseNew) and while the overload manager sheds (Shed).
//
// Without the program (an old kernel, no CAP_BPF, a seccomp filter that
// refuses bpf(2)) the kernel spreads connections by flow hash; Probe says
// why, and MigrateSysctl turns on the kernel's own migration where the
// process may.
package steering

import (
	"errors"
	"fmt"
)

// Mode is how the program picks a socket for a new connection.
type Mode uint64

// The modes, with the values the program reads from the state map.
const (
	// LeastConn picks the socket whose worker has the fewest active
	// connections, ties broken by the flow hash.
	LeastConn Mode = 0
	// Hash picks by flow hash modulo the live sockets.
	Hash Mode = 1
)

func (m Mode) String() string {
	switch m {
	case LeastConn:
		return "least_conn"
	case Hash:
		return "hash"
	}
	return fmt.Sprintf("Mode(%d)", uint64(m))
}

// MaxSockets is the most sockets (workers) one group can steer among: the
// least_conn scan is unrolled this many times in the program.
const MaxSockets = 256

// ErrNotSupported: this platform or kernel cannot run the program. The
// error that wraps it says why.
var ErrNotSupported = errors.New("eBPF reuseport steering not supported")
