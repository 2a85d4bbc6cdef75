package stats

import (
	"runtime/debug"
	"sync/atomic"
	"unsafe"
)

const cacheLine = 64

// processWords allocates one word per lane in process memory, each on its
// own cache line, for stats that are not in a region.
func processWords(lanes int) []*uint64 {
	const per = cacheLine / 8
	buf := make([]uint64, (lanes+1)*per)
	skip := 0
	if a := uintptr(unsafe.Pointer(&buf[0])) % cacheLine; a != 0 {
		skip = int(cacheLine-a) / 8
	}
	ws := make([]*uint64, lanes)
	for i := range ws {
		ws[i] = &buf[skip+i*per]
	}
	return ws
}

// A lane word usually lives in the shared-memory region's mapping. If the
// region file is truncated (by its owner or root: shm refuses files that
// others may write), the word's page is gone until shm restores the file's
// size, microseconds later, and touching it raises SIGBUS, which would kill
// the process. So every lane operation runs with the goroutine's
// SetPanicOnFault on and a deferred recover: a fault loses that one update,
// counts it (stats.region_lost_writes) and the request goes on. It costs a
// few nanoseconds per operation and no lock (BenchmarkCounterInc).

// laneFaults counts lane updates lost to a memory fault, in this process.
var laneFaults atomic.Uint64

// endLaneOp restores the goroutine's fault mode and swallows a memory
// fault. Defer it with the result of debug.SetPanicOnFault(true).
func endLaneOp(old bool) {
	debug.SetPanicOnFault(old)
	if p := recover(); p != nil {
		if _, fault := p.(interface{ Addr() uintptr }); !fault {
			panic(p)
		}
		laneFaults.Add(1)
	}
}

// CounterLane is a counter handle bound to one lane. The zero value is not
// usable. Copy it freely; it is a pointer.
type CounterLane struct{ p *uint64 }

// Inc adds 1.
func (h CounterLane) Inc() {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.AddUint64(h.p, 1)
}

// Add adds n.
func (h CounterLane) Add(n uint64) {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.AddUint64(h.p, n)
}

// GaugeLane is a gauge handle bound to one lane. A gauge's value is the sum
// of its lanes, so a lane may go negative (a connection opened on one
// worker's lane and closed on another's adds up correctly).
type GaugeLane struct{ p *uint64 }

// Inc adds 1.
func (h GaugeLane) Inc() {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.AddUint64(h.p, 1)
}

// Dec subtracts 1.
func (h GaugeLane) Dec() {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.AddUint64(h.p, ^uint64(0))
}

// Add adds d (which may be negative).
func (h GaugeLane) Add(d int64) {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.AddUint64(h.p, uint64(d))
}

// Set sets this lane's share. Use it on one lane only (lane 0 for a
// main-thread gauge such as server.live).
func (h GaugeLane) Set(v int64) {
	defer endLaneOp(debug.SetPanicOnFault(true))
	atomic.StoreUint64(h.p, uint64(v))
}

// sumLanes adds up lane words; a word lost to a fault counts as 0.
func sumLanes(ps []*uint64) (v uint64) {
	defer endLaneOp(debug.SetPanicOnFault(true))
	for _, p := range ps {
		v += atomic.LoadUint64(p)
	}
	return v
}

// Counter is a monotonic counter with one lane per writer.
type Counter struct {
	name  string
	lanes []*uint64
	local bool // in process memory, not in the region
}

// Name returns the stat name.
func (c *Counter) Name() string { return c.name }

// Lane returns the handle for lane i (0 = main, 1..Workers = workers). It
// panics if i is out of range, like a slice index.
func (c *Counter) Lane(i int) CounterLane { return CounterLane{c.lanes[i]} }

// Value returns this generation's count (the sum of its lanes). The value
// across generations is in a region snapshot.
func (c *Counter) Value() uint64 { return sumLanes(c.lanes) }

// Gauge is a gauge with one lane per writer.
type Gauge struct {
	name  string
	mode  GaugeMode
	lanes []*uint64
	local bool
}

// Name returns the stat name.
func (g *Gauge) Name() string { return g.name }

// Lane returns the handle for lane i (0 = main, 1..Workers = workers).
func (g *Gauge) Lane(i int) GaugeLane { return GaugeLane{g.lanes[i]} }

// Mode returns the gauge's mode.
func (g *Gauge) Mode() GaugeMode { return g.mode }

// Value returns this generation's value (the sum of its lanes).
func (g *Gauge) Value() int64 { return int64(sumLanes(g.lanes)) }

func (g *Gauge) zero() {
	for _, p := range g.lanes {
		GaugeLane{p}.Set(0)
	}
}
