package upstream

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"unsafe"

	"github.com/hotproxy/hotproxy/config"
)

// Consistent hashing: ring_hash and maglev send every request with the
// same key (HashKey of its hash_on value) to the same endpoint, on every
// worker of a generation and in every generation after a hot restart. So
// nothing here depends on a per-process seed (hash/maphash has one): the
// key and the endpoints are hashed with FNV-1a and a fixed finalizer, and
// an endpoint is named by its entry in the config ("10.0.0.1:8080",
// "app.internal:8080"), not by its position or its resolved address.

// HashKey hashes a hash_on value (a header's value, a cookie's, a client
// address) for AcquireKey. It never returns 0, which means "no key". It
// does not allocate.
func HashKey(b []byte) uint64 {
	h := uint64(fnvOffset)
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return nonZero(mix64(h))
}

func hashString(s string) uint64 {
	return HashKey(unsafe.Slice(unsafe.StringData(s), len(s)))
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// mix64 is the splitmix64 finalizer: FNV-1a alone spreads short,
// similar keys ("user1", "user2") poorly over a ring.
func mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// Sizes of the lookup tables. A ring of at least minRingSize points
// (Envoy's default minimum is 1024) keeps each endpoint's share within a
// few percent; maglevTableSize is the prime Envoy and the Maglev paper use
// for clusters of up to a few hundred endpoints.
const (
	minRingSize     = 1024
	maxRingSize     = 1 << 20
	maglevTableSize = 65537
)

// hashing is the balancer of a ring_hash or maglev cluster. It has no
// per-worker state, so one is shared by every worker view. Its table is
// built for the usable endpoints of a HostSet, by the first pick that
// meets a new HostSet, and then only read: an atomic pointer, no lock.
type hashing struct {
	maglev bool
	names  []string // by endpoint index: how the config names it
	table  atomic.Pointer[hashTable]
}

// hashTable maps a key to a position in usable, the slice of the HostSet
// it was built for (its identity: HostSets are immutable).
type hashTable struct {
	usable *int32
	n      int
	ring   []ringPoint // ring_hash: sorted by hash
	maglev []int32     // maglev: position in usable, by key % maglevTableSize
}

type ringPoint struct {
	hash uint64
	pos  int32
}

func newHashing(policy string, names []string) *hashing {
	return &hashing{maglev: policy == config.LBMaglev, names: names}
}

// pick returns the position of key's endpoint among usable; a request
// without a key (0) goes to one picked at random.
func (b *hashing) pick(usable []int32, key uint64) int {
	n := len(usable)
	if n <= 1 {
		return 0
	}
	if key == 0 {
		return rand.IntN(n)
	}
	t := b.table.Load()
	if t == nil || t.usable != unsafe.SliceData(usable) || t.n != n {
		// A HostSet published without prepare (tests): whoever meets
		// it first builds its table (workers racing build the same
		// one; the last store wins).
		t = b.build(usable)
		b.table.Store(t)
	}
	if b.maglev {
		return int(t.maglev[key%maglevTableSize])
	}
	i, _ := slices.BinarySearchFunc(t.ring, key, func(p ringPoint, k uint64) int {
		switch {
		case p.hash < k:
			return -1
		case p.hash > k:
			return 1
		}
		return 0
	})
	if i == len(t.ring) {
		i = 0 // past the last point: the ring wraps
	}
	return int(t.ring[i].pos)
}

// prepare builds the table for usable before the HostSet that holds it is
// published, on the main side: a maglev table takes milliseconds, which
// a worker's request must not wait for. A nil b (another policy) does
// nothing.
func (b *hashing) prepare(usable []int32) {
	if b != nil && len(usable) > 1 {
		b.table.Store(b.build(usable))
	}
}

func (b *hashing) build(usable []int32) *hashTable {
	t := &hashTable{usable: unsafe.SliceData(usable), n: len(usable)}
	if b.maglev {
		t.maglev = buildMaglev(b.namesOf(usable))
	} else {
		t.ring = buildRing(b.namesOf(usable), len(b.names))
	}
	return t
}

func (b *hashing) namesOf(usable []int32) []string {
	out := make([]string, len(usable))
	for p, i := range usable {
		if int(i) < len(b.names) {
			out[p] = b.names[i]
		} else {
			out[p] = strconv.Itoa(int(i))
		}
	}
	return out
}

// buildRing places each endpoint at ceil(minRingSize/total) points, each
// the hash of "name_replica" (Envoy's scheme); a key goes to the first
// point at or after its hash. total is the cluster's endpoint count, not
// the usable ones': an endpoint leaving then moves only its own keys.
func buildRing(names []string, total int) []ringPoint {
	n := max(total, len(names))
	replicas := (minRingSize + n - 1) / n
	if replicas*n > maxRingSize {
		replicas = max(1, maxRingSize/n)
	}
	ring := make([]ringPoint, 0, replicas*len(names))
	buf := make([]byte, 0, 64)
	for p, name := range names {
		for r := range replicas {
			buf = append(append(append(buf[:0], name...), '_'), strconv.Itoa(r)...)
			ring = append(ring, ringPoint{hash: HashKey(buf), pos: int32(p)})
		}
	}
	slices.SortFunc(ring, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.pos - b.pos) // equal hashes: the same order everywhere
	})
	return ring
}

// buildMaglev fills the lookup table of the Maglev paper (Eisenbud et al.,
// NSDI 2016, §3.4): each endpoint walks the table from its own offset by
// its own skip, taking turns, claiming the first free entry. Shares are
// equal within one entry, and an endpoint leaving moves little else.
func buildMaglev(names []string) []int32 {
	const m = maglevTableSize
	n := len(names)
	offset, skip, next := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for p, name := range names {
		h := hashString(name)
		offset[p] = h % m
		skip[p] = mix64(h^0x9e3779b97f4a7c15)%(m-1) + 1
	}
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	for filled := 0; ; {
		for p := range n {
			c := (offset[p] + next[p]*skip[p]) % m
			for table[c] >= 0 {
				next[p]++
				c = (offset[p] + next[p]*skip[p]) % m
			}
			table[c] = int32(p)
			next[p]++
			if filled++; filled == m {
				return table
			}
		}
	}
}

func (*hashing) start(int)    {}
func (*hashing) finish(int)   {}
func (*hashing) counts() bool { return false }

var _ balancer = (*hashing)(nil)
