package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"runtime/metrics"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// Server stats, on the main goroutine's lane (0). They are GaugeNewest:
// the region shows the newest live generation's value, not a sum.
//
//	server.live               1 while this generation is LIVE, else 0
//	server.state              0 live, 1 draining, 2 initializing (Envoy's numbering)
//	server.hot_restart_epoch  the restart epoch
//	server.uptime             seconds since this generation started (at each flush)
//	server.concurrency        the number of workers
//	server.memory_allocated   heap bytes in live and unswept objects (runtime/metrics
//	                          /memory/classes/heap/objects:bytes, at each flush)
//
// and one counter, continuous across generations like every counter:
//
//	server.hot_restart.peer_refused  peers the restart socket turned away
//	                                 (another uid, garbage, a second child, an
//	                                 unsupervised one); their warnings are
//	                                 rate-limited, this count is not
type serverStats struct {
	live        stats.GaugeLane
	state       stats.GaugeLane
	epoch       stats.GaugeLane
	uptime      stats.GaugeLane
	concurrency stats.GaugeLane
	memory      stats.GaugeLane

	// peerRefused is added to from the restart socket's own count, by
	// the flush loop (lane 0 has one writer); peerRefusedCounted is how
	// much of that count it has added so far.
	peerRefused        stats.CounterLane
	peerRefusedCounted uint64

	mem []metrics.Sample // read by the flush loop only
}

const heapObjectsMetric = "/memory/classes/heap/objects:bytes"

// stateValue maps a State to server.state.
func stateValue(st State) int64 {
	switch st {
	case StateLive:
		return 0
	case StateDraining:
		return 1
	}
	return 2
}

// openStats opens the shared-memory region of this base-id and builds the
// generation's stats store on it. A region file that cannot be used
// (truncated, foreign, another layout version, another user's) is an error
// that names the path: the generation refuses to start rather than write
// over it.
func (s *Server) openStats() error {
	if s.opts.BaseID < 0 {
		return fmt.Errorf("stats: base-id %d is negative", s.opts.BaseID)
	}
	sc := s.cfg.Stats
	lanes := s.concurrency + 1
	region, err := shm.Open(shm.Options{
		Path:     sc.Path,
		BaseID:   uint64(s.opts.BaseID),
		Mode:     sc.Mode(),
		Epoch:    uint64(max(s.opts.Epoch, 0)),
		Lanes:    lanes,
		MaxLanes: max(shm.DefaultMaxLanes, lanes),
		// An owner slot for every generation the supervisor lets live
		// at once: the draining ones, the serving one, one starting.
		MaxOwners: max(shm.DefaultMaxOwners, s.cfg.HotRestart.MaxDrainingGenerations+2),
		Logger:    s.log,
	})
	if err != nil {
		return err
	}
	store, err := stats.New(stats.Options{
		Region:        region,
		Workers:       s.concurrency,
		FlushInterval: sc.FlushInterval.D(),
		Logger:        s.log,
		// The owner's heartbeat is the watchdog's least recent loop's.
		Liveness: func() time.Time { return s.wd.liveness() },
	})
	if err != nil {
		region.Close()
		return err
	}
	s.region, s.stats = region, store
	s.wd = newWatchdog(s.cfg.Watchdog, store, s.concurrency, s.log)
	g := func(name string) stats.GaugeLane { return store.Gauge(name, stats.GaugeNewest).Lane(0) }
	s.srvStats = serverStats{
		live:        g("server.live"),
		state:       g("server.state"),
		epoch:       g("server.hot_restart_epoch"),
		uptime:      g("server.uptime"),
		concurrency: g("server.concurrency"),
		memory:      g("server.memory_allocated"),
		peerRefused: store.Counter("server.hot_restart.peer_refused").Lane(0),
		mem:         []metrics.Sample{{Name: heapObjectsMetric}},
	}
	s.srvStats.epoch.Set(int64(s.opts.Epoch))
	s.srvStats.concurrency.Set(int64(s.concurrency))
	s.refreshGauges()
	s.log.Debug("stats region attached", "path", region.Path(), "slot", region.Slot(), "lanes", lanes)
	return nil
}

// setState moves the generation to st. The flush loop publishes it in
// server.live and server.state at once (and at every flush, so a state
// stored directly in s.state shows within one flush interval).
func (s *Server) setState(st State) {
	s.state.Store(int32(st))
	select {
	case s.statsKick <- struct{}{}:
	default:
	}
}

// publishState writes the current state into server.live and server.state.
// Before Run, New calls it; during Run, only the flush loop does.
func (s *Server) publishState() {
	st := s.State()
	live := int64(0)
	if st == StateLive {
		live = 1
	}
	s.srvStats.live.Set(live)
	s.srvStats.state.Set(stateValue(st))
}

// refreshGauges updates the gauges sampled at each flush.
func (s *Server) refreshGauges() {
	ss := &s.srvStats
	s.publishState()
	ss.uptime.Set(int64(time.Since(s.started) / time.Second))
	metrics.Read(ss.mem)
	if v := ss.mem[0].Value; v.Kind() == metrics.KindUint64 {
		ss.memory.Set(int64(v.Uint64()))
	}
	s.countRefusedPeers()
}

// countRefusedPeers adds the restart socket's refusals since the last call
// to server.hot_restart.peer_refused.
func (s *Server) countRefusedPeers() {
	if s.hr.listener == nil {
		return
	}
	ss := &s.srvStats
	n := s.hr.listener.Refused()
	ss.peerRefused.Add(n - ss.peerRefusedCounted)
	ss.peerRefusedCounted = n
}

// runStats starts the flush loop: every flush interval it refreshes the
// sampled gauges and flushes the store (histograms into the region, a
// heartbeat, the folding of dead generations). It is the main thread's
// loop, the only writer of lane 0 while the generation runs. The returned
// function ends the generation's stats: it stops the loop and retires
// from the region. Call it once every worker manager is closed.
func (s *Server) runStats() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.cfg.Stats.FlushInterval.D())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.statsKick:
				s.publishState()
			case <-t.C:
				s.refreshGauges()
				if err := s.stats.Flush(); err != nil {
					s.log.Warn("stats flush", "error", err)
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		s.publishState()
		s.countRefusedPeers()
		if !s.statsQuiet(retireWait) {
			// A handler or connection goroutine cut short by a forced
			// drain may still add to a lane: unmapping the region under
			// it would crash the process. Stay attached instead; once
			// this process exits, the next generation to attach or flush
			// folds its counters (as after a crash: nothing is lost).
			s.log.Warn("stats: requests or connections still winding down; leaving the region to fold this generation after exit",
				"region", s.region.Path(), "waited", retireWait)
			if err := s.stats.Close(); err != nil {
				s.log.Warn("stats: last flush", "error", err)
			}
			return
		}
		if err := s.closeStats(); err != nil {
			s.log.Warn("stats: retiring from the region", "error", err)
		}
	}
}

// retireWait bounds the wait for the last lane writers at the end of a
// generation.
const retireWait = 2 * time.Second

// statsQuiet waits up to d until this generation has no request or
// connection in flight: every *_active gauge of its store (requests,
// client and upstream connections) is 0 in its own lanes. The code that
// ends a request or connection decrements its gauge last, so then no
// goroutine is left to write a lane.
func (s *Server) statsQuiet(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		busy := int64(0)
		for _, g := range s.stats.Gauges() {
			if g.Mode() == stats.GaugeSum && strings.HasSuffix(g.Name(), "_active") {
				busy += max(g.Value(), -g.Value())
			}
		}
		if busy == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closeStats flushes the store a last time and retires this generation
// from the region: its counter lanes fold into the retired totals, its
// gauges drop out. Every lane writer (workers, flush loop) must have
// stopped. Idempotent.
func (s *Server) closeStats() error {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if s.stats == nil || s.statsClosed {
		return nil
	}
	s.statsClosed = true
	return errors.Join(s.stats.Close(), s.region.Close())
}

// statsSnapshot reads every stat from the region (all live generations and
// the retired totals) plus what this store keeps in process memory.
func (s *Server) statsSnapshot() (*shm.Snapshot, error) {
	s.statsMu.RLock()
	defer s.statsMu.RUnlock()
	if s.statsClosed {
		return nil, errors.New("stats: this generation has retired from the stats region")
	}
	return s.stats.Snapshot()
}

// exposeOptions reads ?filter=REGEX and ?usedonly.
func exposeOptions(r *http.Request) (stats.ExposeOptions, error) {
	var o stats.ExposeOptions
	q := r.URL.Query()
	if f := q.Get("filter"); f != "" {
		re, err := regexp.Compile(f)
		if err != nil {
			return o, fmt.Errorf("filter %q: not a regular expression: %v", f, err)
		}
		o.Filter = re
	}
	_, o.UsedOnly = q["usedonly"]
	return o, nil
}

// handleStats: GET /stats[?filter=REGEX][&usedonly][&format=json|prometheus|vmrange].
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	format := r.URL.Query().Get("format")
	switch format {
	case "", "text", "json", "prometheus", "vmrange":
	default:
		http.Error(w, fmt.Sprintf("format %q: use text (the default), json, prometheus or vmrange", format), http.StatusBadRequest)
		return
	}
	s.writeStats(w, r, format)
}

// handleStatsPrometheus: GET /stats/prometheus[?filter=REGEX][&usedonly][&format=vmrange].
// The default is classic le histograms, which Prometheus can use;
// ?format=vmrange writes VictoriaMetrics vmrange buckets instead.
func (s *Server) handleStatsPrometheus(w http.ResponseWriter, r *http.Request) {
	switch format := r.URL.Query().Get("format"); format {
	case "", "prometheus":
		s.writeStats(w, r, "prometheus")
	case "vmrange":
		s.writeStats(w, r, "vmrange")
	default:
		http.Error(w, fmt.Sprintf("format %q: use prometheus (the default: classic le histograms) or vmrange (VictoriaMetrics buckets)", format), http.StatusBadRequest)
	}
}

func (s *Server) writeStats(w http.ResponseWriter, r *http.Request, format string) {
	o, err := exposeOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	snap, err := s.statsSnapshot()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	switch format {
	case "json":
		w.Header().Set("Content-Type", "application/json")
		err = stats.WriteJSON(w, snap, o)
	case "prometheus":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		err = stats.WritePrometheus(w, snap, o)
	case "vmrange":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		err = stats.WritePrometheusVMRange(w, snap, o)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		err = stats.WriteText(w, snap, o)
	}
	if err != nil && s.log.IsDebug() {
		s.log.Debug("admin: writing stats", "error", err)
	}
}
