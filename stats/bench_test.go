package stats

// Hot-path benchmarks. Run:
//
//	go test -run='^$' -bench=. -cpu 1,2 ./stats/
//
// Each RunParallel goroutine takes its OWN lane, as a worker does.

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/hotproxy/hotproxy/shm"
)

const benchWorkers = 63

func benchStore(b *testing.B) *Store {
	b.Helper()
	r, err := shm.Open(shm.Options{Path: filepath.Join(b.TempDir(), "bench.stats"), Lanes: benchWorkers + 1,
		MaxLanes: benchWorkers + 1, MaxRecords: 1024, MaxOwners: 2})
	if errors.Is(err, errors.ErrUnsupported) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Options{Region: r, Workers: benchWorkers})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close(); r.Close() })
	return s
}

// laneTaker hands each RunParallel goroutine its own worker lane.
type laneTaker struct{ next atomic.Int32 }

func (l *laneTaker) take(b *testing.B) int {
	n := int(l.next.Add(1))
	if n > benchWorkers {
		b.Fatalf("more than %d goroutines", benchWorkers)
	}
	return n
}

func BenchmarkCounterInc(b *testing.B) {
	h := benchStore(b).Counter("bench.counter").Lane(1)
	b.ReportAllocs()
	for b.Loop() {
		h.Inc()
	}
}

func BenchmarkCounterIncParallel(b *testing.B) {
	c := benchStore(b).Counter("bench.counter")
	var lt laneTaker
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := c.Lane(lt.take(b))
		for pb.Next() {
			h.Inc()
		}
	})
}

func BenchmarkGaugeAdd(b *testing.B) {
	h := benchStore(b).Gauge("bench.gauge", GaugeSum).Lane(1)
	b.ReportAllocs()
	for b.Loop() {
		h.Add(1)
	}
}

func BenchmarkGaugeAddParallel(b *testing.B) {
	g := benchStore(b).Gauge("bench.gauge", GaugeSum)
	var lt laneTaker
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := g.Lane(lt.take(b))
		for pb.Next() {
			h.Add(1)
		}
	})
}

var benchValues = func() []float64 {
	v := make([]float64, 1024)
	x := 0.0001
	for i := range v {
		v[i] = x
		x *= 1.013
	}
	return v
}()

func BenchmarkHistogramRecord(b *testing.B) {
	h := benchStore(b).Histogram("bench.hist").Lane(1)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h.Record(benchValues[i&1023])
		i++
	}
}

func BenchmarkHistogramRecordParallel(b *testing.B) {
	hist := benchStore(b).Histogram("bench.hist")
	var lt laneTaker
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := hist.Lane(lt.take(b))
		i := 0
		for pb.Next() {
			h.Record(benchValues[i&1023])
			i++
		}
	})
}

func BenchmarkVMCounterInc(b *testing.B) {
	c := metrics.NewSet().NewCounter("bench_counter")
	b.ReportAllocs()
	for b.Loop() {
		c.Inc()
	}
}

func BenchmarkVMCounterIncParallel(b *testing.B) {
	c := metrics.NewSet().NewCounter("bench_counter")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Inc()
		}
	})
}

func BenchmarkVMHistogramUpdate(b *testing.B) {
	h := metrics.NewSet().NewHistogram("bench_hist")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h.Update(benchValues[i&1023])
		i++
	}
}

func BenchmarkVMHistogramUpdateParallel(b *testing.B) {
	h := metrics.NewSet().NewHistogram("bench_hist")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			h.Update(benchValues[i&1023])
			i++
		}
	})
}

var sharedWord uint64

func BenchmarkAtomicAddShared(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		atomic.AddUint64(&sharedWord, 1)
	}
}

func BenchmarkAtomicAddSharedParallel(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			atomic.AddUint64(&sharedWord, 1)
		}
	})
}
