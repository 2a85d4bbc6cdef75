package accesslog

import "sync/atomic"

// queue is a bounded multi-producer, single-consumer queue of records
// (Dmitry Vyukov's bounded MPMC queue with one consumer): a producer
// claims a slot with one CAS and publishes it with one store; no lock,
// and a full queue fails at once. Each slot's sequence number says whose
// turn it is: pos (free for the producer of pos), pos+1 (filled, for the
// consumer), pos+size (free again, for the next lap).
type queue struct {
	mask  uint64
	slots []slot
	_     [64]byte
	head  atomic.Uint64 // next position to claim (producers)
	_     [56]byte
	tail  uint64 // next position to read (the consumer alone)
}

type slot struct {
	seq atomic.Uint64
	rec Record
}

func (q *queue) init(size int) {
	n := 1
	for n < size {
		n <<= 1
	}
	q.mask = uint64(n - 1)
	q.slots = make([]slot, n)
	for i := range q.slots {
		q.slots[i].seq.Store(uint64(i))
	}
}

// push copies r into the queue; false when it is full.
func (q *queue) push(r *Record) bool {
	pos := q.head.Load()
	for {
		s := &q.slots[pos&q.mask]
		seq := s.seq.Load()
		switch diff := int64(seq) - int64(pos); {
		case diff == 0:
			if q.head.CompareAndSwap(pos, pos+1) {
				s.rec = *r
				s.seq.Store(pos + 1)
				return true
			}
			pos = q.head.Load()
		case diff < 0:
			return false // the slot of the previous lap is not read yet: full
		default:
			pos = q.head.Load() // another producer took pos
		}
	}
}

// pop moves the oldest record into r; false when there is none ready.
func (q *queue) pop(r *Record) bool {
	s := &q.slots[q.tail&q.mask]
	if s.seq.Load() != q.tail+1 {
		return false
	}
	*r = s.rec
	s.rec.Cluster, s.rec.Upstream = "", "" // keep nothing alive
	s.seq.Store(q.tail + q.mask + 1)
	q.tail++
	return true
}

// empty reports whether the next record to read is not there yet (the
// consumer only).
func (q *queue) empty() bool {
	return q.slots[q.tail&q.mask].seq.Load() != q.tail+1
}
