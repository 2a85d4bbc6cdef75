// Package workers runs the per-core workers: each owns its listener sockets,
// its accept loops, its connections and its upstream pools, and reads the
// configuration only through an immutable snapshot that the main thread
// publishes to it (DESIGN §3).
package workers

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/server/config"
)

// Identity is what direct responses may show of the running generation.
type Identity struct {
	Version  string
	Epoch    int
	PID      int
	Hostname string
}

// Snapshot is everything a worker needs to serve, built by the main thread
// from a validated config and never changed afterwards. Connections keep
// the snapshot they started with.
type Snapshot struct{}

// BuildSnapshot compiles routes and builds clusters from cfg (already
// validated by config.Load). It touches no socket: this is the fail-fast
// build step. An error names the listener, route or cluster at fault.
func BuildSnapshot(cfg *config.Config, id Identity) (*Snapshot, error) { panic("contract") }

// SocketKey names one listening socket: the listener's address and the
// worker that owns it (Worker is -1 for a socket shared by all workers).
type SocketKey struct {
	Network string // "tcp"
	Address string // as written in config, e.g. "127.0.0.1:8080"
	Worker  int
}

// Options configures a Manager. The zero value of each optional field is
// the default.
type Options struct {
	Config      *config.Config // validated
	Concurrency int            // resolved worker count (>= 1)
	Logger      hclog.Logger   // nil: a null logger
	// Inherited are listening sockets handed over by a previous
	// generation, by key. A socket found here is used instead of binding;
	// the Manager owns the file afterwards. Sockets left unused are
	// returned by Unused for the caller to drain.
	Inherited map[SocketKey]*os.File
}

// Manager owns all workers of one generation.
type Manager struct{}

// New binds (or adopts) every listener socket for every worker and returns
// a Manager that is not yet accepting. A bind failure is an error that
// names the listener, the address and what to do; nothing stays bound.
func New(opts Options, snap *Snapshot) (*Manager, error) { panic("contract") }

// Start starts every worker's accept loops.
func (m *Manager) Start() { panic("contract") }

// Publish hands a new snapshot to every worker (RCU): new connections and
// requests use it, those in flight keep theirs.
func (m *Manager) Publish(snap *Snapshot) { panic("contract") }

// Sockets returns the listening sockets by key, as files (dups) that the
// caller may pass to another process.
func (m *Manager) Sockets() (map[SocketKey]*os.File, error) { panic("contract") }

// Unused returns inherited sockets that no listener took.
func (m *Manager) Unused() map[SocketKey]*os.File { panic("contract") }

// Drain stops accepting on every listener, makes HTTP responses carry
// "Connection: close", closes idle keep-alive connections and waits for
// in-flight HTTP requests and TCP connections to finish. When ctx ends,
// whatever is left is closed. Drain is idempotent.
func (m *Manager) Drain(ctx context.Context) error { panic("contract") }

// Close closes every socket and connection at once.
func (m *Manager) Close() error { panic("contract") }
