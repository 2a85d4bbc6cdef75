// Package resmon reads the resources the overload manager watches: the Go
// heap, the memory of the cgroup this process runs in, and its open file
// descriptors. Each reading is a few small reads (runtime/metrics, a few
// files in /sys/fs/cgroup and /proc), made on the main goroutine once per
// overload interval, never on the request path.
package resmon

import (
	"errors"
	"runtime/metrics"
)

// ErrNotSupported: the resource cannot be read on this platform.
var ErrNotSupported = errors.New("resmon: not supported on this platform")

// Runtime metrics read by Heap. /gc/heap/live:bytes is what the last
// garbage collection found reachable: what the process holds, unlike the
// heap in use, which also counts garbage not yet collected and so swings
// with GC pacing.
const (
	heapLiveMetric     = "/gc/heap/live:bytes"
	heapInUseMetric    = "/memory/classes/heap/objects:bytes"
	totalMetric        = "/memory/classes/total:bytes"
	heapReleasedMetric = "/memory/classes/heap/released:bytes"
	gcCyclesMetric     = "/gc/cycles/total:gc-cycles"
)

// Heap reads the Go heap. Not safe for concurrent use.
type Heap struct {
	samples []metrics.Sample
}

// NewHeap returns a Heap reader.
func NewHeap() *Heap {
	return &Heap{samples: []metrics.Sample{{Name: heapLiveMetric}, {Name: heapInUseMetric}, {Name: totalMetric}, {Name: heapReleasedMetric}, {Name: gcCyclesMetric}}}
}

// HeapReading is one reading of the Go runtime's memory, in bytes.
type HeapReading struct {
	Live  uint64 // reachable at the last GC
	InUse uint64 // heap objects, live and not yet swept
	// Runtime is what the Go memory limit (debug.SetMemoryLimit) bounds:
	// all memory mapped by the runtime but the heap returned to the OS
	// (stacks and runtime metadata included).
	Runtime uint64
	// GCCycles counts the garbage collections completed so far.
	GCCycles uint64
}

// Read reads the heap.
func (h *Heap) Read() HeapReading {
	metrics.Read(h.samples)
	u := func(i int) uint64 {
		if v := h.samples[i].Value; v.Kind() == metrics.KindUint64 {
			return v.Uint64()
		}
		return 0
	}
	r := HeapReading{Live: u(0), InUse: u(1), GCCycles: u(4)}
	if total, released := u(2), u(3); total > released {
		r.Runtime = total - released
	}
	return r
}
