// Package stats is hotproxy's stats model: a Store of named counters,
// gauges and histograms, scopes (name prefixes removable as a group),
// lane handles for the hot path, per-worker caches for rare dynamic names,
// the histogram flush, and exposition (text, JSON, Prometheus, the owner
// table, and Watch blocks with counter rates).
//
// # Lanes
//
// Every stat has one lane per writer: lane 0 is the main goroutine's and
// lanes 1..Workers are the workers'. A writer resolves a handle once, when
// config is built, and increments it per event with a single uncontended
// atomic add: no lookup, no lock, no allocation.
//
//	c := store.Counter("listener.web.downstream_cx_total")
//	h := c.Lane(worker) // once
//	h.Inc()             // per event
//
// Lanes of different writers never share a cache line. A worker's
// connections run on many goroutines, so lane words are updated with atomic
// adds; they are uncontended because only one worker writes a lane and
// readers only load.
//
// # Shared memory
//
// With a region (Options.Region, see package shm) counters and gauges live
// in shared memory and survive hot restarts: a counter's value is
// continuous across generations, a gauge adds up across live generations
// (GaugeSum) or shows the newest generation's value (GaugeNewest).
// Histograms record into per-worker double buffers; every flush interval
// the main goroutine (Store.Run or Store.Flush) flips them and adds the
// interval's bucket counts to the region. When the region is full, a stat
// keeps working in process memory, stats.overflow counts it and one warning
// is logged. Without a region the Store works in process memory only.
//
// # Histogram buckets
//
// Buckets mirror the VictoriaMetrics/metrics Histogram (vmrange): 18
// log-spaced buckets per power of ten from 1e-9 to 1e18, plus one below and
// one above, so merging is element-wise addition and Prometheus exposition
// emits vmrange buckets.
package stats
