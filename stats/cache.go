package stats

import "sync/atomic"

// LaneCache serves the rare dynamic stat name on one lane (a worker's)
// without a lock: hits read an immutable map through an atomic pointer;
// a miss creates the stat in the Store (which locks) and publishes a new
// map (copy on write). Safe for concurrent use by the lane's goroutines.
type LaneCache struct {
	store      *Store
	lane       int
	counters   atomic.Pointer[map[string]CounterLane]
	gauges     atomic.Pointer[map[string]GaugeLane]
	histograms atomic.Pointer[map[string]*HistogramLane]
}

// Cache returns a new cache for lane (0 = main, 1..Workers = workers).
// Keep one per worker. It panics if lane is out of range.
func (s *Store) Cache(lane int) *LaneCache {
	if lane < 0 || lane >= s.lanes {
		panic("stats: cache lane out of range")
	}
	return &LaneCache{store: s, lane: lane}
}

func cached[V any](p *atomic.Pointer[map[string]V], name string, make func() V) V {
	if m := p.Load(); m != nil {
		if v, ok := (*m)[name]; ok {
			return v
		}
	}
	v := make()
	for {
		old := p.Load()
		next := map[string]V{name: v}
		if old != nil {
			if w, ok := (*old)[name]; ok {
				return w
			}
			for k, w := range *old {
				next[k] = w
			}
		}
		if p.CompareAndSwap(old, &next) {
			return v
		}
	}
}

// Counter returns the lane handle of the counter name.
func (c *LaneCache) Counter(name string) CounterLane {
	return cached(&c.counters, name, func() CounterLane { return c.store.Counter(name).Lane(c.lane) })
}

// Gauge returns the lane handle of the gauge name (mode applies if it is
// created).
func (c *LaneCache) Gauge(name string, mode GaugeMode) GaugeLane {
	return cached(&c.gauges, name, func() GaugeLane { return c.store.Gauge(name, mode).Lane(c.lane) })
}

// Histogram returns the lane handle of the histogram name.
func (c *LaneCache) Histogram(name string) *HistogramLane {
	return cached(&c.histograms, name, func() *HistogramLane { return c.store.Histogram(name).Lane(c.lane) })
}
