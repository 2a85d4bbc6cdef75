package workers

import "sync/atomic"

// Counters are the plain totals of one listener, for one worker or summed
// over all of them. They stand in for the shared-memory stats of a later
// issue and keep Envoy's names in their comments.
type Counters struct {
	DownstreamCxTotal  uint64 // downstream_cx_total
	DownstreamCxActive int64  // downstream_cx_active
	DownstreamRqTotal  uint64 // downstream_rq_total (http)
	Rq2xx              uint64 // downstream_rq_2xx
	Rq3xx              uint64 // downstream_rq_3xx
	Rq4xx              uint64 // downstream_rq_4xx
	Rq5xx              uint64 // downstream_rq_5xx
	BytesIn            uint64 // downstream_cx_rx_bytes_total: read from clients
	BytesOut           uint64 // downstream_cx_tx_bytes_total: written to clients
}

// ListenerCounters are one listener's counters, total and per worker.
type ListenerCounters struct {
	Listener  string
	Total     Counters
	PerWorker []Counters // index: worker
}

func (c *Counters) add(o Counters) {
	c.DownstreamCxTotal += o.DownstreamCxTotal
	c.DownstreamCxActive += o.DownstreamCxActive
	c.DownstreamRqTotal += o.DownstreamRqTotal
	c.Rq2xx += o.Rq2xx
	c.Rq3xx += o.Rq3xx
	c.Rq4xx += o.Rq4xx
	c.Rq5xx += o.Rq5xx
	c.BytesIn += o.BytesIn
	c.BytesOut += o.BytesOut
}

// counters is one worker's counters for one listener. Only that worker's
// connections write it (atomics: a worker's connections run on several
// goroutines); readers sum the workers. Padded so that two workers'
// counters never share a cache line.
type counters struct {
	_        [64]byte
	cxTotal  atomic.Uint64
	cxActive atomic.Int64
	rqTotal  atomic.Uint64
	rq       [4]atomic.Uint64 // 2xx..5xx
	bytesIn  atomic.Uint64
	bytesOut atomic.Uint64
	_        [64]byte
}

// status counts a response status in its class.
func (c *counters) status(code int) {
	if k := code/100 - 2; k >= 0 && k < len(c.rq) {
		c.rq[k].Add(1)
	}
}

func (c *counters) load() Counters {
	return Counters{
		DownstreamCxTotal:  c.cxTotal.Load(),
		DownstreamCxActive: c.cxActive.Load(),
		DownstreamRqTotal:  c.rqTotal.Load(),
		Rq2xx:              c.rq[0].Load(),
		Rq3xx:              c.rq[1].Load(),
		Rq4xx:              c.rq[2].Load(),
		Rq5xx:              c.rq[3].Load(),
		BytesIn:            c.bytesIn.Load(),
		BytesOut:           c.bytesOut.Load(),
	}
}
