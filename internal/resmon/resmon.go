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
	heapLiveMetric  = "/gc/heap/live:bytes"
	heapInUseMetric = "/memory/classes/heap/objects:bytes"
)

// Heap reads the Go heap. Not safe for concurrent use.
type Heap struct {
	samples []metrics.Sample
}

// NewHeap returns a Heap reader.
func NewHeap() *Heap {
	return &Heap{samples: []metrics.Sample{{Name: heapLiveMetric}, {Name: heapInUseMetric}}}
}

// Read returns the live heap (reachable at the last GC) and the heap in
// use (live and unswept objects), in bytes.
func (h *Heap) Read() (live, inUse uint64) {
	metrics.Read(h.samples)
	if v := h.samples[0].Value; v.Kind() == metrics.KindUint64 {
		live = v.Uint64()
	}
	if v := h.samples[1].Value; v.Kind() == metrics.KindUint64 {
		inUse = v.Uint64()
	}
	return live, inUse
}
