package upstream

import (
	"sync/atomic"
	"testing"

	"github.com/hotproxy/hotproxy/config"
)

func TestLeastRequestPicksTheLessBusyOfTwo(t *testing.T) {
	b := newBalancer(config.LBLeastRequest, 2, 0).(*leastRequest)
	all := []int32{0, 1}
	b.start(0)
	for range 100 {
		if i := b.pick(all, 0); i != 1 {
			t.Fatalf("picked busy endpoint %d", i)
		}
	}
	b.finish(0)
	b.start(1)
	b.start(1)
	for range 100 {
		if i := b.pick(all, 0); i != 0 {
			t.Fatalf("picked busy endpoint %d", i)
		}
	}
}

func TestPickStaysInRange(t *testing.T) {
	for _, policy := range []string{config.LBRoundRobin, config.LBLeastRequest, config.LBRandom} {
		for n := 1; n <= 4; n++ {
			b := newBalancer(policy, n, 7)
			usable := allEndpoints(n)
			for range 1000 {
				if i := b.pick(usable, 0); i < 0 || i >= n {
					t.Fatalf("%s over %d endpoints picked %d", policy, n, i)
				}
			}
		}
	}
}

func benchmarkPick(b *testing.B, policy string) {
	bal := newBalancer(policy, 8, 0)
	usable := allEndpoints(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := bal.pick(usable, 0)
			bal.start(i)
			bal.finish(i)
		}
	})
}

// Each iteration is a whole pick: choose, start, finish.
func BenchmarkRoundRobinPick(b *testing.B)   { benchmarkPick(b, config.LBRoundRobin) }
func BenchmarkLeastRequestPick(b *testing.B) { benchmarkPick(b, config.LBLeastRequest) }
func BenchmarkRandomPick(b *testing.B)       { benchmarkPick(b, config.LBRandom) }

func TestPickDoesNotAllocate(t *testing.T) {
	for _, policy := range []string{config.LBRoundRobin, config.LBLeastRequest, config.LBRandom} {
		bal := newBalancer(policy, 8, 0)
		usable := allEndpoints(8)
		if n := testing.AllocsPerRun(100, func() {
			i := bal.pick(usable, 0)
			bal.start(i)
			bal.finish(i)
		}); n != 0 {
			t.Errorf("%s: %v allocations per pick", policy, n)
		}
	}
}

// Each parallel goroutine is its own worker with its own balancer, as in
// the proxy: picks on different workers must not slow each other down.
func BenchmarkRoundRobinPickPerWorker(b *testing.B) {
	c := &Cluster{Name: "backend", Endpoints: make([]Endpoint, 8)}
	c.ForWorker(0) // views are made by one goroutine, the main one
	var w atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		bal := c.ForWorker(int(w.Add(1))).bal
		usable := allEndpoints(8)
		for pb.Next() {
			i := bal.pick(usable, 0)
			bal.start(i)
			bal.finish(i)
		}
	})
}

func allEndpoints(n int) []int32 {
	u := make([]int32, n)
	for i := range u {
		u[i] = int32(i)
	}
	return u
}
