package workers

import (
	"strconv"
	"sync/atomic"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/stats"
)

// Stat names. Listener stats are listener.<name>.<stat>, worker stats
// worker.<index>.<stat> (index from 0; the worker writes lane index+1).
const (
	statCxTotal   = "downstream_cx_total"          // counter: connections accepted
	statCxActive  = "downstream_cx_active"         // gauge (sum over generations): connections open
	statCxDestroy = "downstream_cx_destroy"        // counter: connections closed
	statRqTotal   = "downstream_rq_total"          // counter: HTTP requests
	statRqActive  = "downstream_rq_active"         // gauge (sum): HTTP requests in flight
	statRqTime    = "downstream_rq_time"           // histogram: milliseconds, request start to response end
	statRxBytes   = "downstream_cx_rx_bytes_total" // counter: bytes read from clients
	statTxBytes   = "downstream_cx_tx_bytes_total" // counter: bytes written to clients
)

// statCxOverflow counts connections closed at once, never served: over a
// max_connections bound, or shed when out of file descriptors. They are in
// no other downstream_cx_* stat.
const statCxOverflow = "downstream_cx_overflow"

// statAccessLogDropped counts requests whose access-log line was dropped:
// the log's queue was full (its writer is slower than traffic), or the
// write failed (a full disk).
const statAccessLogDropped = "access_log.dropped"

// statRq are the response-class counters, by status/100 - 1. 1xx counts
// the final ones only: a 101 that upgrades the connection (WebSocket), not
// an interim 100 Continue or 103 passed on before the real response.
var statRq = [5]string{"downstream_rq_1xx", "downstream_rq_2xx", "downstream_rq_3xx", "downstream_rq_4xx", "downstream_rq_5xx"}

// listenerStats are one worker's handles on one listener's stats, bound to
// the worker's lane when the Manager is built: a connection or a request
// adds to them without a lookup, a lock or an allocation.
type listenerStats struct {
	// Stats are the request lanes the HTTP front end counts on
	// (downstream/http), and the bytes both front ends count.
	httpfront.Stats

	cxTotal   stats.CounterLane
	cxActive  stats.GaugeLane
	cxDestroy stats.CounterLane
	// workerCx is worker.<i>.downstream_cx_total: the spread of
	// connections over workers.
	workerCx stats.CounterLane

	cxOverflow stats.CounterLane // connections refused (statCxOverflow)
	// steerActive is this worker's active-connection count in the
	// listener's eBPF state map, which the least_conn program reads
	// (steer.go); nil without a program. A plain atomic add on shared
	// memory: no syscall per connection.
	steerActive *atomic.Uint64
	// tls: a listener that terminates TLS (tls.go); nil otherwise.
	tls *tlsStats
	// sniNoRoute: a TLS passthrough listener (downstream/tcp); zero otherwise.
	sniNoRoute stats.CounterLane
}

func newListenerStats(st *stats.Store, listener string, worker int) *listenerStats {
	lane := worker + 1
	p := "listener." + listener + "."
	ls := &listenerStats{
		cxTotal:   st.Counter(p + statCxTotal).Lane(lane),
		cxActive:  st.Gauge(p+statCxActive, stats.GaugeSum).Lane(lane),
		cxDestroy: st.Counter(p + statCxDestroy).Lane(lane),
	}
	ls.RqTotal = st.Counter(p + statRqTotal).Lane(lane)
	ls.RqActive = st.Gauge(p+statRqActive, stats.GaugeSum).Lane(lane)
	ls.RqTime = st.Histogram(p + statRqTime).Lane(lane)
	ls.RxBytes = st.Counter(p + statRxBytes).Lane(lane)
	ls.TxBytes = st.Counter(p + statTxBytes).Lane(lane)
	ls.workerCx = st.Counter("worker." + strconv.Itoa(worker) + "." + statCxTotal).Lane(lane)
	ls.cxOverflow = st.Counter(p + statCxOverflow).Lane(lane)
	ls.LogDropped = st.Counter(p + statAccessLogDropped).Lane(lane)
	// Declared with the others, not at the first HTTP/2 request: a stat
	// no live generation declares is shown as retired.
	ls.RqHTTP2 = st.Counter(p + httpfront.StatRqHTTP2).Lane(lane)
	ls.H2Calm = st.Counter(p + httpfront.StatH2Calm).Lane(lane)
	ls.IdleParked = st.Counter(p + httpfront.StatIdleParked).Lane(lane)
	for i, n := range statRq {
		ls.Rq[i] = st.Counter(p + n).Lane(lane)
	}
	return ls
}

// accepted counts a new client connection.
func (ls *listenerStats) accepted() {
	ls.cxTotal.Inc()
	ls.workerCx.Inc()
	ls.cxActive.Inc()
	if ls.steerActive != nil {
		ls.steerActive.Add(1)
	}
}

// closed counts the end of a client connection. The gauge goes last: once
// every *_active gauge is 0 nothing writes the lanes any more (see
// server's retirement from the region).
func (ls *listenerStats) closed() {
	ls.cxDestroy.Inc()
	if ls.steerActive != nil {
		ls.steerActive.Add(^uint64(0))
	}
	ls.cxActive.Dec()
}
