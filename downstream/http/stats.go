package httpfront

import (
	"time"

	"github.com/hotproxy/hotproxy/stats"
)

// Stats are one worker's handles on one listener's request stats, bound
// to the worker's lane when the Manager is built (the worker declares
// them, in its order, with its connection stats): a request adds to
// them without a lookup, a lock or an allocation.
type Stats struct {
	RqTotal  stats.CounterLane    // downstream_rq_total
	RqActive stats.GaugeLane      // downstream_rq_active
	Rq       [5]stats.CounterLane // downstream_rq_1xx..5xx, by status/100 - 1
	RqTime   *stats.HistogramLane // downstream_rq_time, milliseconds
	// RxBytes and TxBytes are the bytes read from and written to
	// clients (the TCP front end counts on the same lanes).
	RxBytes stats.CounterLane
	TxBytes stats.CounterLane
	// LogDropped counts the requests whose access-log line was dropped
	// (access_log.dropped).
	LogDropped stats.CounterLane
	RqHTTP2    stats.CounterLane // downstream_rq_http2_total
	// H2Calm counts the HTTP/2 connections cut with a GOAWAY for a flood
	// (downstream_cx_http2_calm_total).
	H2Calm stats.CounterLane
	// IdleParked counts the parks of idle HTTP/1.1 connections in the
	// worker's idle poller (downstream_cx_idle_parked_total): one per
	// connection idle for the park grace, none per busy keep-alive
	// request.
	IdleParked stats.CounterLane
}

// StatIdleParked is IdleParked's name under listener.<name>.
const StatIdleParked = "downstream_cx_idle_parked_total"

// Status counts a final response status in its class (0: not counted).
func (s *Stats) Status(code int) {
	if k := code/100 - 1; k >= 0 && k < len(s.Rq) {
		s.Rq[k].Inc()
	}
}

// RequestStarted counts a request begun: in the total and in flight.
func (s *Stats) RequestStarted() {
	s.RqTotal.Inc()
	s.RqActive.Inc()
}

// RequestEnded counts its end, took after its start: its time
// (RequestDone), and no longer in flight.
func (s *Stats) RequestEnded(took time.Duration) {
	s.RequestDone(took)
	s.RqActive.Dec()
}

// RequestDone records a request's time, took, in milliseconds.
func (s *Stats) RequestDone(took time.Duration) {
	s.RqTime.Record(float64(took) / float64(time.Millisecond))
}
