package upstream

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/hotproxy/hotproxy/config"
)

// balancer chooses an endpoint for each connection or request of one
// worker, among the usable endpoints of the cluster's current HostSet. Its
// methods are called from many goroutines of that worker at once, so its
// state is atomics only: no lock on the request path.
type balancer interface {
	// pick returns the position in usable (endpoint indices, never
	// empty) of the endpoint to try first. key is the request's
	// hash_on key (HashKey), 0 for none; only hashing balancers use it.
	pick(usable []int32, key uint64) int
	// start and finish bracket the use of endpoint i (from the attempt to
	// connect until the connection or response is done with).
	start(i int)
	finish(i int)
	// counts reports whether start and finish do anything, so callers can
	// skip the bookkeeping (and its allocations) when they do not.
	counts() bool
}

// newBalancer builds worker w's balancer over n endpoints. policy has been
// checked by NewCluster; anything else falls back to round robin.
func newBalancer(policy string, n, w int) balancer {
	switch policy {
	case config.LBLeastRequest:
		return &leastRequest{active: make([]paddedCount, n)}
	case config.LBRandom:
		return &random{n: n}
	default:
		rr := &roundRobin{n: uint64(n)}
		// Workers start at different endpoints: after a restart every
		// worker's first request would otherwise land on endpoint 0.
		rr.next.Store(uint64(w))
		return rr
	}
}

// cacheLine is the padding that keeps one writer's hot word off a line that
// another core writes.
const cacheLine = 64

type roundRobin struct {
	_    [cacheLine]byte
	next atomic.Uint64
	_    [cacheLine - 8]byte
	n    uint64
}

func (b *roundRobin) pick(usable []int32, _ uint64) int {
	n := uint64(len(usable))
	if n <= 1 {
		return 0
	}
	return int((b.next.Add(1) - 1) % n)
}

func (*roundRobin) start(int)    {}
func (*roundRobin) finish(int)   {}
func (*roundRobin) counts() bool { return false }

// random is stateless: math/rand/v2's top-level functions use a per-thread
// generator, so goroutines of every worker draw without contention.
type random struct{ n int }

func (b *random) pick(usable []int32, _ uint64) int {
	if len(usable) <= 1 {
		return 0
	}
	return rand.IntN(len(usable))
}

func (*random) start(int)    {}
func (*random) finish(int)   {}
func (*random) counts() bool { return false }

// paddedCount is one endpoint's in-flight count. Neighbouring endpoints'
// counts are written by different goroutines (on different cores), so each
// has its own cache line.
type paddedCount struct {
	n atomic.Int64
	_ [cacheLine - 8]byte
}

// leastRequest is power of two choices over this worker's in-flight counts
// per endpoint: two distinct endpoints drawn at random, the less busy one
// wins. It avoids the herd that "pick the global minimum" sends to a
// freshly idle endpoint, and costs two loads.
type leastRequest struct {
	active []paddedCount
}

func (b *leastRequest) pick(usable []int32, _ uint64) int {
	n := len(usable)
	if n <= 1 {
		return 0
	}
	i := rand.IntN(n)
	j := rand.IntN(n - 1)
	if j >= i {
		j++
	}
	if b.active[usable[j]].n.Load() < b.active[usable[i]].n.Load() {
		return j
	}
	return i
}

func (b *leastRequest) start(i int)  { b.active[i].n.Add(1) }
func (b *leastRequest) finish(i int) { b.active[i].n.Add(-1) }
func (*leastRequest) counts() bool   { return true }

var (
	_ balancer = (*roundRobin)(nil)
	_ balancer = (*random)(nil)
	_ balancer = (*leastRequest)(nil)
)
