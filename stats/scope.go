package stats

import (
	"errors"
	"strings"
	"sync"
)

// Scope returns a scope whose stats are named prefix + "." + name.
func (s *Store) Scope(prefix string) *Scope { return &Scope{store: s, prefix: prefix} }

// Scope is a name prefix whose stats can be removed as a group.
type Scope struct {
	store  *Store
	prefix string

	parent *Scope

	mu    sync.Mutex // guards names
	names map[string]bool
}

func (sc *Scope) full(name string) string {
	if sc.prefix == "" {
		return name
	}
	if name == "" {
		return sc.prefix
	}
	return sc.prefix + "." + name
}

func (sc *Scope) track(name string) string {
	n := sc.full(name)
	for p := sc; p != nil; p = p.parent {
		p.mu.Lock()
		if p.names == nil {
			p.names = map[string]bool{}
		}
		p.names[n] = true
		p.mu.Unlock()
	}
	return n
}

// Prefix returns the scope's prefix.
func (sc *Scope) Prefix() string { return sc.prefix }

// Counter returns the counter prefix.name.
func (sc *Scope) Counter(name string) *Counter { return sc.store.Counter(sc.track(name)) }

// Gauge returns the gauge prefix.name.
func (sc *Scope) Gauge(name string, mode GaugeMode) *Gauge {
	return sc.store.Gauge(sc.track(name), mode)
}

// Histogram returns the histogram prefix.name.
func (sc *Scope) Histogram(name string) *Histogram {
	return sc.store.Histogram(sc.track(name))
}

// Scope returns a child scope prefix.name whose stats are removed with
// this one too.
func (sc *Scope) Scope(name string) *Scope {
	return &Scope{store: sc.store, prefix: sc.full(name), parent: sc}
}

// Remove drops the stats created through this scope (and its children)
// from the store: their gauges are zeroed, their histograms flushed a last
// time, and this generation no longer declares them in the region (once
// no live generation does, they are retired: shm.Stat.Retired). Counters in a region keep their values there (they are continuous
// across restarts); a later Counter of the same name continues them.
// Counter and gauge handles still held keep working (in process memory
// they are no longer exposed); histogram handles are no longer flushed.
func (sc *Scope) Remove() error {
	s := sc.store
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	prefix := sc.prefix + "."
	s.mu.Lock()
	var hs []*Histogram
	sc.mu.Lock()
	owned := sc.names
	sc.names = nil
	sc.mu.Unlock()
	match := func(n string) bool { return sc.prefix == "" || n == sc.prefix || strings.HasPrefix(n, prefix) }
	var inRegion []string // removed stats that have a record: undeclared
	for n, c := range s.counters {
		if match(n) && n != OverflowCounter && owned[n] {
			delete(s.counters, n)
			if !c.local {
				inRegion = append(inRegion, n)
			}
		}
	}
	for n, g := range s.gauges {
		if match(n) && owned[n] {
			g.zero()
			delete(s.gauges, n)
			if !g.local {
				inRegion = append(inRegion, n)
			}
		}
	}
	for n, h := range s.histograms {
		if match(n) && owned[n] {
			hs = append(hs, h)
			delete(s.histograms, n)
			if h.region != nil {
				inRegion = append(inRegion, n)
			}
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.flush())
	}
	// This generation no longer declares them: once no live one does,
	// readers show them as retired (hidden by default).
	for _, n := range inRegion {
		errs = append(errs, s.region.Undeclare(n))
	}
	return errors.Join(errs...)
}
