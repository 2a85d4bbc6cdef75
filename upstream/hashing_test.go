package upstream

import (
	"fmt"
	"testing"

	"github.com/hotproxy/hotproxy/config"
)

func hashCluster(t testing.TB, policy string, eps ...string) *Cluster {
	t.Helper()
	c, err := NewCluster(config.Cluster{Name: "h", LBPolicy: policy, HashOn: "header:x-user", Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHashSameKeySameHost: a key reaches the same endpoint from every
// worker's view and from a cluster built again (a new generation), and
// keys spread over every endpoint.
func TestHashSameKeySameHost(t *testing.T) {
	eps := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}
	for _, policy := range []string{config.LBRingHash, config.LBMaglev} {
		t.Run(policy, func(t *testing.T) {
			a, b := hashCluster(t, policy, eps...), hashCluster(t, policy, eps...)
			views := []*WorkerCluster{a.ForWorker(0), a.ForWorker(1), b.ForWorker(0), b.ForWorker(5)}
			share := make([]int, len(eps))
			const keys = 4000
			for k := range keys {
				key := HashKey(fmt.Appendf(nil, "user-%d", k))
				want := -1
				for _, wc := range views {
					hs := wc.state.hosts.Load()
					got := int(hs.usable[wc.bal.pick(hs.usable, key)])
					if want == -1 {
						want = got
					} else if got != want {
						t.Fatalf("key %d: endpoint %d on one view, %d on another", k, want, got)
					}
				}
				share[want]++
			}
			for i, n := range share {
				// An even share is 1000; ring_hash at 1024 points is
				// within a few tens of percent.
				if n < keys/len(eps)/2 || n > keys/len(eps)*2 {
					t.Errorf("endpoint %d got %d of %d keys: %v", i, n, keys, share)
				}
			}
		})
	}
}

// TestHashEndpointLeaving: when an endpoint stops being usable, the keys
// of the others stay where they were.
func TestHashEndpointLeaving(t *testing.T) {
	for _, policy := range []string{config.LBRingHash, config.LBMaglev} {
		t.Run(policy, func(t *testing.T) {
			b := newHashing(policy, []string{"a:1", "b:1", "c:1", "d:1"})
			all, without := []int32{0, 1, 2, 3}, []int32{0, 1, 3}
			moved := 0
			// All picks of one host set, then all of the other: the
			// table is built once for each.
			before := make([]int32, 2000)
			for k := range before {
				before[k] = all[b.pick(all, HashKey(fmt.Appendf(nil, "k%d", k)))]
			}
			for k := range before {
				after := without[b.pick(without, HashKey(fmt.Appendf(nil, "k%d", k)))]
				if before[k] != 2 && before[k] != after {
					moved++
				}
				if after == 2 {
					t.Fatal("a key went to the endpoint that left")
				}
			}
			// Maglev may move a few others (the paper's "minimal
			// disruption" is not zero); the ring moves none.
			if limit := map[string]int{config.LBRingHash: 0, config.LBMaglev: 2000 / 20}[policy]; moved > limit {
				t.Errorf("%d keys of staying endpoints moved (limit %d)", moved, limit)
			}
		})
	}
}

func TestHashKeyFixed(t *testing.T) {
	// A fixed value: a change of the hash would move every user's
	// traffic at the next upgrade, which must be a decision.
	if got := HashKey([]byte("alice")); got != HashKey([]byte("alice")) || got == 0 || got == HashKey([]byte("bob")) {
		t.Fatalf("HashKey not stable or not spread: %x", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { HashKey([]byte("alice")) }); allocs != 0 {
		t.Errorf("HashKey allocates %v", allocs)
	}
}

func BenchmarkMaglevPick(b *testing.B) {
	bal := newHashing(config.LBMaglev, []string{"a:1", "b:1", "c:1", "d:1"})
	usable := allEndpoints(4)
	key := HashKey([]byte("alice"))
	b.ReportAllocs()
	for b.Loop() {
		bal.pick(usable, key)
	}
}

func BenchmarkRingHashPick(b *testing.B) {
	bal := newHashing(config.LBRingHash, []string{"a:1", "b:1", "c:1", "d:1"})
	usable := allEndpoints(4)
	key := HashKey([]byte("alice"))
	b.ReportAllocs()
	for b.Loop() {
		bal.pick(usable, key)
	}
}

// TestHashTablePreparedOffWorkers: the table of a published host set is
// built before the workers see it, so no request builds one.
func TestHashTablePreparedOffWorkers(t *testing.T) {
	c := hashCluster(t, config.LBMaglev, "127.0.0.1:1", "127.0.0.1:2")
	hs := c.state.hosts.Load()
	tb := c.hashing.table.Load()
	if tb == nil || tb.usable != &hs.usable[0] {
		t.Fatal("NewCluster published a host set without its table")
	}
	c.ForWorker(0).bal.pick(hs.usable, HashKey([]byte("k")))
	if c.hashing.table.Load() != tb {
		t.Error("a pick rebuilt a prepared table")
	}
}
