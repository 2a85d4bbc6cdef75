package workers

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/workers/steering"
)

// statBalanceMigrated is listener.<name>.balance_migrated: connections the
// eBPF program moved off a closing socket of the listener to a live one.
const statBalanceMigrated = "balance_migrated"

// queueEmptyingEnv, set to "off", stops a draining generation from taking
// what is still queued on its sockets before closing them (queueDrainMax):
// a diagnostic switch, and how the integration test proves that the
// program's migration alone loses nothing.
const queueEmptyingEnv = "HOTPROXY_QUEUE_EMPTYING"

// Protections of a closing socket's queue, as logged.
const (
	protectProgram  = "eBPF migration: a closing socket's queue moves to a live one"
	protectSysctl   = "net.ipv4.tcp_migrate_req: the kernel moves a closing socket's queue to a live one"
	protectEmptying = "queue emptying: a stopping generation accepts what is queued before it closes (up to 1s)"
)

// steerMode maps a listener's balance (validated and defaulted before the
// snapshot was compiled) to the program's mode; ok is false for kernel (no
// program), today's plain SO_REUSEPORT.
func steerMode(balance string) (steering.Mode, bool) {
	switch balance {
	case config.BalanceLeastConn:
		return steering.LeastConn, true
	case config.BalanceHash:
		return steering.Hash, true
	}
	return 0, false
}

// startSteering loads the listener's program before its sockets are
// opened (openListener then keeps only one socket per worker), or records
// why it cannot.
func startSteering(ml *mlistener, workers int, reuse bool) {
	mode, want := steerMode(ml.balance)
	switch {
	case !want:
		return
	case !reuse:
		// One socket shared by all workers: nothing to steer, and no
		// sibling to migrate to. Not a fallback: nothing is missing.
		return
	case workers > steering.MaxSockets:
		ml.steerErr = fmt.Errorf("%d workers: the program steers among at most %d", workers, steering.MaxSockets)
		return
	}
	g, err := steering.New(mode)
	if err != nil {
		ml.steerErr, ml.steerUnloadable = err, true
		return
	}
	ml.steer = g
}

// attachSteering puts the listener's sockets (exactly one per worker, by
// worker) in the program's socket array and attaches it to the group,
// replacing a previous generation's program. Without a program it takes a
// previous generation's off the group, so the kernel's hash applies.
func attachSteering(ml *mlistener, workers int, inherited bool) {
	if ml.steer != nil {
		err := func() error {
			if len(ml.sockets) != workers {
				return fmt.Errorf("%d sockets for %d workers (an inherited socket shared by all workers?)", len(ml.sockets), workers)
			}
			conns := make([]syscall.Conn, workers)
			for _, s := range ml.sockets {
				if s.owner < 0 || s.owner >= workers || conns[s.owner] != nil {
					return fmt.Errorf("socket of worker %d does not fit %d workers", s.owner, workers)
				}
				conns[s.owner] = s.ln
			}
			err := ml.steer.Attach(conns)
			for try := 0; errors.Is(err, syscall.EBUSY) && try < attachRetries; try++ {
				// Another generation's socket array still holds the
				// sockets: one that handed them over without
				// letting go (an older binary), or a next generation
				// that died and left its program on the group (a
				// rollback). Taking its program off the group frees
				// its array, and the sockets with it, once the
				// kernel's RCU grace period has passed.
				_ = steering.Detach(ml.sockets[0].ln)
				time.Sleep(attachRetryDelay)
				err = ml.steer.Attach(conns)
			}
			return err
		}()
		if err == nil {
			return
		}
		ml.steer.Close()
		ml.steer = nil
		ml.steerErr = err
	}
	if inherited && len(ml.sockets) > 0 && ml.sockets[0].owner >= 0 {
		// Best effort: a group without a program answers ENOENT or EINVAL.
		_ = steering.Detach(ml.sockets[0].ln)
	}
}

// Attach retries while another generation's socket array lets go of the
// sockets (attachSteering): bounded, 0.5s in all.
const (
	attachRetries    = 50
	attachRetryDelay = 10 * time.Millisecond
)

// logSteering says once per listener how its connections are spread and
// what protects a closing socket's queue. Where the program was wanted but
// cannot run, it turns net.ipv4.tcp_migrate_req on if it may.
func logSteering(log hclog.Logger, ml *mlistener, emptying bool) {
	if len(ml.sockets) < 2 && ml.steer == nil && ml.steerErr == nil {
		return // one socket: nothing to spread, no sibling to migrate to
	}
	fallbackProtection := func() string {
		if emptying {
			return protectEmptying
		}
		return "none: queue emptying is off (" + queueEmptyingEnv + "=off)"
	}
	switch {
	case ml.steer != nil:
		ml.protection = protectProgram
		log.Info("listener balance", "listener", ml.name, "balance", ml.balance, "workers", len(ml.sockets), "protection", ml.protection)
	case ml.steerErr != nil:
		ml.protection = fallbackProtection()
		// Where the program cannot load at all (no CAP_BPF, an old
		// kernel, seccomp) the kernel's own migration is the next
		// best thing; it is a setting of the whole network
		// namespace, so a program that loaded but could not attach
		// (a passing state of a hand-over) leaves it as it is.
		if ml.steerUnloadable {
			if on, err := steering.MigrateSysctl(); on {
				ml.protection = protectSysctl
			} else {
				log.Debug("net.ipv4.tcp_migrate_req stays off", "error", err)
			}
		} else if migrateSysctlOn() {
			ml.protection = protectSysctl
		}
		log.Warn("listener balance: the eBPF program cannot run; falling back to the kernel's flow hash",
			"listener", ml.name, "balance_wanted", ml.balance, "balance", config.BalanceKernel,
			"reason", ml.steerErr.Error(), "protection", ml.protection)
	default:
		ml.protection = fallbackProtection()
		if migrateSysctlOn() {
			ml.protection = protectSysctl
		}
		log.Info("listener balance", "listener", ml.name, "balance", config.BalanceKernel, "protection", ml.protection)
	}
}

// migrateSysctlOn reports whether net.ipv4.tcp_migrate_req is on.
func migrateSysctlOn() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_migrate_req")
	return err == nil && len(b) > 0 && b[0] == '1'
}

// migratedPoll is how often the program's migration count reaches the
// stats.
const migratedPoll = time.Second

// countMigrations adds what the listeners' programs migrated to
// listener.<name>.balance_migrated (the main thread's lane), and what they
// refused for stop_accepting to the overload counters
// (countKernelRefusals), until stop closes, and once more then.
func (m *Manager) countMigrations(stop <-chan struct{}) {
	type watched struct {
		lane stats.CounterLane
		seen uint64
	}
	// By program: the listeners UpdateListeners adds join at the next
	// flush (a group's counts stay readable after its Close).
	ws := map[*steering.Group]*watched{}
	flush := func() {
		m.countKernelRefusals()
		for _, sl := range m.steeredListeners() {
			w := ws[sl.g]
			if w == nil {
				w = &watched{lane: m.stats.Counter("listener." + sl.ml.name + "." + statBalanceMigrated).Lane(0)}
				ws[sl.g] = w
			}
			if n := sl.g.Migrated(); n > w.seen {
				w.lane.Add(n - w.seen)
				w.seen = n
			}
		}
	}
	t := time.NewTicker(migratedPoll)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			flush()
		case <-stop:
			flush()
			return
		}
	}
}

// steeredListener is a listener with its steering program.
type steeredListener struct {
	ml *mlistener
	g  *steering.Group
}

// steeredListeners returns the listeners (serving or still draining) that
// a steering program spreads, with their programs, read under m.mu: the
// main goroutine's Resteer replaces a program under it while the
// migration counter reads them.
func (m *Manager) steeredListeners() []steeredListener {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []steeredListener
	for _, ls := range [][]*mlistener{m.listeners, m.retiring} {
		for _, ml := range ls {
			if ml.steer != nil {
				out = append(out, steeredListener{ml, ml.steer})
			}
		}
	}
	return out
}

// activeCount is the per-worker active-connection count a least_conn
// program reads: nil without a program.
func activeCount(ml *mlistener, worker int) *atomic.Uint64 {
	if ml.steer == nil {
		return nil
	}
	return ml.steer.Active(worker)
}
