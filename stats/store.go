package stats

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hotproxy/hotproxy/shm"
)

// GaugeMode says how a gauge adds up across live generations.
type GaugeMode = shm.GaugeMode

// Gauge modes.
const (
	// GaugeSum: the sum over live generations (connections in flight).
	GaugeSum = shm.GaugeSum
	// GaugeNewest: the newest live generation's value only (server.live).
	GaugeNewest = shm.GaugeNewest
)

// Defaults.
const (
	DefaultFlushInterval = time.Second
	// OverflowCounter counts stats kept in process memory because the
	// region was full (or had the name with another kind).
	OverflowCounter = "stats.overflow"
	// RegionTruncatedCounter counts the times this generation found the
	// region file truncated and restored it (the values in the lost part
	// start again from zero).
	RegionTruncatedCounter = "stats.region_truncated"
	// RegionLostWritesCounter counts lane updates lost because the region
	// file was truncated under them, before its size was restored.
	RegionLostWritesCounter = "stats.region_lost_writes"
)

// Options configures a Store. The zero value is a region-less store with
// only the main lane.
type Options struct {
	// Region holds the stats in shared memory; nil keeps them in process
	// memory only. The caller opens it with shm.Open (Lanes: Workers+1)
	// and closes it after Store.Close.
	Region *shm.Region
	// Workers is the number of worker lanes; lanes are 0 (main) and
	// 1..Workers.
	Workers int
	// FlushInterval of histograms, for Run. Default DefaultFlushInterval.
	FlushInterval time.Duration
	// Logger; default a null logger.
	Logger hclog.Logger
	// Liveness, when set, is the time Flush stores as the owner's
	// heartbeat in the region (a watchdog's least recent loop), instead
	// of the time of the flush: the flush runs on a goroutine of its own,
	// which lives on while the loops a supervisor cares about are stuck.
	Liveness func() time.Time
}

// Store is the set of stats of one generation. Creating stats takes a lock;
// using lane handles does not. Safe for concurrent use.
type Store struct {
	region   *shm.Region
	lanes    int
	interval time.Duration
	log      hclog.Logger
	liveness func() time.Time
	overflow CounterLane
	warned   atomic.Bool

	// Truncation accounting, on the main lane; seen* are the totals
	// already counted (under flushMu).
	truncated, lostWrites       CounterLane
	seenTruncations, seenFaults uint64

	// mu guards the maps below.
	mu         sync.Mutex
	counters   map[string]*Counter
	gauges     map[string]*Gauge
	histograms map[string]*Histogram
	closed     bool

	// flushMu serialises flushes (histogram flips).
	flushMu sync.Mutex
}

// New builds a Store.
func New(opts Options) (*Store, error) {
	if opts.Workers < 0 {
		return nil, fmt.Errorf("stats: workers %d < 0", opts.Workers)
	}
	s := &Store{
		region:     opts.Region,
		lanes:      opts.Workers + 1,
		interval:   opts.FlushInterval,
		liveness:   opts.Liveness,
		log:        opts.Logger,
		counters:   map[string]*Counter{},
		gauges:     map[string]*Gauge{},
		histograms: map[string]*Histogram{},
	}
	if s.interval <= 0 {
		s.interval = DefaultFlushInterval
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	s.log = s.log.Named("stats")
	if s.region != nil && s.region.Lanes() < s.lanes {
		return nil, fmt.Errorf("stats: region %s has %d lanes for this generation, need %d (1 + %d workers): open it with shm.Options.Lanes = %d",
			s.region.Path(), s.region.Lanes(), s.lanes, opts.Workers, s.lanes)
	}
	s.overflow = s.Counter(OverflowCounter).Lane(0)
	s.truncated = s.Counter(RegionTruncatedCounter).Lane(0)
	s.lostWrites = s.Counter(RegionLostWritesCounter).Lane(0)
	s.seenFaults = laneFaults.Load()
	return s, nil
}

// Lanes returns the number of lanes (1 + Workers).
func (s *Store) Lanes() int { return s.lanes }

// Region returns the region, or nil.
func (s *Store) Region() *shm.Region { return s.region }

// allocLocked places a stat in the region, or reports that it must live in
// process memory.
func (s *Store) allocLocked(name string, kind shm.Kind, mode GaugeMode) (shm.RecordID, bool) {
	if s.region == nil {
		return 0, false
	}
	id, err := s.region.Alloc(name, kind, mode)
	if err == nil {
		return id, true
	}
	if name != OverflowCounter {
		s.overflow.Inc()
	}
	if errors.Is(err, shm.ErrFull) {
		if s.warned.CompareAndSwap(false, true) {
			s.log.Warn("stats region full: new stats are kept in process memory and do not survive a restart (see stats.overflow)",
				"region", s.region.Path(), "stat", name, "error", err)
		}
	} else {
		s.log.Warn("stat kept in process memory", "stat", name, "error", err)
	}
	return 0, false
}

func (s *Store) laneWords(id shm.RecordID, inRegion bool) []*uint64 {
	if !inRegion {
		return processWords(s.lanes)
	}
	ws := make([]*uint64, s.lanes)
	for i := range ws {
		p, err := s.region.Lane(id, i)
		if err != nil {
			// The record and lanes were checked; what is left is a full
			// filesystem under the region (shm.Region.Lane touches the
			// word: ENOSPC, named in err). Stay usable.
			s.log.Error("stats lane unavailable, using process memory", "error", err)
			return processWords(s.lanes)
		}
		ws[i] = p
	}
	return ws
}

// Counter returns the counter of that name, creating it if needed.
func (s *Store) Counter(name string) *Counter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counters[name]; ok {
		return c
	}
	id, ok := s.allocLocked(name, shm.KindCounter, 0)
	c := &Counter{name: name, lanes: s.laneWords(id, ok), local: !ok}
	s.counters[name] = c
	return c
}

// Gauge returns the gauge of that name, creating it with mode if needed
// (an existing gauge keeps its mode).
func (s *Store) Gauge(name string, mode GaugeMode) *Gauge {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.gauges[name]; ok {
		return g
	}
	id, ok := s.allocLocked(name, shm.KindGauge, mode)
	g := &Gauge{name: name, mode: mode, lanes: s.laneWords(id, ok), local: !ok}
	s.gauges[name] = g
	return g
}

// Histogram returns the histogram of that name, creating it if needed.
func (s *Store) Histogram(name string) *Histogram {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.histograms[name]; ok {
		return h
	}
	id, ok := s.allocLocked(name, shm.KindHistogram, 0)
	h := &Histogram{name: name, id: id, lanes: make([]*HistogramLane, s.lanes)}
	h.total.Buckets = make([]uint64, NumBuckets)
	if ok {
		h.region = s.region
	}
	for i := range h.lanes {
		h.lanes[i] = new(HistogramLane)
	}
	s.histograms[name] = h
	return h
}

// Flush flips and merges every histogram into this generation's totals
// and the region, and stores a heartbeat and folds dead generations in the
// region. Call it from the main goroutine (Run does, each interval).
func (s *Store) Flush() error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	hs := make([]*Histogram, 0, len(s.histograms))
	for _, h := range s.histograms {
		hs = append(hs, h)
	}
	s.mu.Unlock()
	var errs []error
	if s.region != nil {
		// First: if the file was truncated since the last check, restore it
		// before the histograms are added into it.
		if err := s.region.Check(); err != nil {
			errs = append(errs, err)
		}
		s.countTruncationsLocked()
	}
	for _, h := range hs {
		if err := h.flush(); err != nil {
			errs = append(errs, fmt.Errorf("histogram %s: %w", h.name, err))
		}
	}
	if s.region != nil {
		if s.liveness != nil {
			s.region.HeartbeatAt(s.liveness())
		} else {
			s.region.Heartbeat()
		}
		if err := s.region.Reap(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// countTruncationsLocked counts the region's truncations and the lane
// updates they cost since the last flush, and says so loudly. The caller
// holds flushMu.
func (s *Store) countTruncationsLocked() {
	n, faults := s.region.Truncations(), laneFaults.Load()
	newTrunc, newFaults := n-s.seenTruncations, faults-s.seenFaults
	s.seenTruncations, s.seenFaults = n, faults
	if newFaults > 0 {
		s.lostWrites.Add(newFaults)
	}
	if newTrunc == 0 {
		return
	}
	s.truncated.Add(newTrunc)
	s.log.Error("the stats region file was truncated under this generation; its size and records were restored and it keeps serving, but the counts in the lost part started again from zero. Only its owner or root can do this: find what truncates it (a cleanup job, a copy of the file?)",
		"region", s.region.Path(), "times", newTrunc, "lost_lane_writes", newFaults,
		"counted_in", RegionTruncatedCounter)
}

// Run flushes every flush interval until ctx is done, then flushes once
// more and returns.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := s.Flush(); err != nil {
				s.log.Warn("final stats flush", "error", err)
			}
			return
		case <-t.C:
			if err := s.Flush(); err != nil {
				s.log.Warn("stats flush", "error", err)
			}
		}
	}
}

// Close flushes the histograms a last time. It does not close the region.
// Call it after the workers stopped, then close the region.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	return s.Flush()
}

// Gauges returns the gauges of this store, in no particular order.
func (s *Store) Gauges() []*Gauge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Gauge, 0, len(s.gauges))
	for _, g := range s.gauges {
		out = append(out, g)
	}
	return out
}

// Snapshot returns every stat with its value. With a region it is the
// region's snapshot (all generations) plus the stats this store keeps in
// process memory; without one, this store's stats.
func (s *Store) Snapshot() (*shm.Snapshot, error) {
	snap := &shm.Snapshot{Major: shm.LayoutMajor, Minor: shm.LayoutMinor}
	if s.region != nil {
		var err error
		if snap, err = s.region.Snapshot(); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.counters {
		if c.local {
			snap.Stats = append(snap.Stats, shm.Stat{Name: c.name, Kind: shm.KindCounter, Counter: c.Value()})
		}
	}
	for _, g := range s.gauges {
		if g.local {
			snap.Stats = append(snap.Stats, shm.Stat{Name: g.name, Kind: shm.KindGauge, Mode: g.mode, Gauge: g.Value()})
		}
	}
	for _, h := range s.histograms {
		if h.region == nil {
			v := h.Value()
			snap.Stats = append(snap.Stats, shm.Stat{Name: h.name, Kind: shm.KindHistogram, Histogram: &v})
		}
	}
	sort.SliceStable(snap.Stats, func(i, j int) bool { return snap.Stats[i].Name < snap.Stats[j].Name })
	return snap, nil
}
