package stats

import (
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

// CounterLane is a counter handle bound to one lane. The zero value is not
// usable. Copy it freely; it is a pointer.
type CounterLane struct{ p *uint64 }

// Inc adds 1.
func (h CounterLane) Inc() { atomic.AddUint64(h.p, 1) }

// Add adds n.
func (h CounterLane) Add(n uint64) { atomic.AddUint64(h.p, n) }

// GaugeLane is a gauge handle bound to one lane. A gauge's value is the sum
// of its lanes, so a lane may go negative (a connection opened on one
// worker's lane and closed on another's adds up correctly).
type GaugeLane struct{ p *uint64 }

// Inc adds 1.
func (h GaugeLane) Inc() { atomic.AddUint64(h.p, 1) }

// Dec subtracts 1.
func (h GaugeLane) Dec() { atomic.AddUint64(h.p, ^uint64(0)) }

// Add adds d (which may be negative).
func (h GaugeLane) Add(d int64) { atomic.AddUint64(h.p, uint64(d)) }

// Set sets this lane's share. Use it on one lane only (lane 0 for a
// main-thread gauge such as server.live).
func (h GaugeLane) Set(v int64) { atomic.StoreUint64(h.p, uint64(v)) }

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
func (c *Counter) Value() uint64 {
	var v uint64
	for _, p := range c.lanes {
		v += atomic.LoadUint64(p)
	}
	return v
}

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
func (g *Gauge) Value() int64 {
	var v uint64
	for _, p := range g.lanes {
		v += atomic.LoadUint64(p)
	}
	return int64(v)
}

func (g *Gauge) zero() {
	for _, p := range g.lanes {
		atomic.StoreUint64(p, 0)
	}
}
