package server

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/workers"
)

// The watchdog ([watchdog], Envoy's GuardDog): the main goroutine stores a
// heartbeat on a ticker of its loop (Run), every worker's accept loops
// store theirs (workers.Manager.WorkerHeartbeatAges), and a goroutine of
// its own looks at them every half miss_timeout. A loop whose heartbeat
// is older than miss_timeout has stalled: that stall counts one miss, and
// one mega miss once it is older than mega_miss_timeout; older than
// kill_timeout (if set), the generation aborts with every goroutine's
// stack in the log. The generation's heartbeat in the stats region's
// owner table is its least recent loop's, so that the supervisor sees a
// generation whose main loop is stuck as wedged (watchdog.supervisor_timeout)
// even though its flush goroutine still runs. None of it is on the
// request path.
//
// Stats (lane 0, written by the watchdog goroutine alone):
//
//	watchdog.miss, watchdog.mega_miss                 stalls of any loop
//	watchdog.main.miss, watchdog.main.mega_miss       stalls of the main loop
//	watchdog.worker.<n>.miss, .mega_miss              stalls of worker n's accept loops
//	watchdog.main.heartbeat_age_ms                    gauges: age of each heartbeat at
//	watchdog.worker.<n>.heartbeat_age_ms              the last look (newest generation's)
type watchdog struct {
	cfg   config.Watchdog
	start time.Time
	// mainBeat is the main loop's heartbeat, nanoseconds after start.
	mainBeat atomic.Int64
	// watchingMain is false once the main loop has ended (the
	// generation stops: its drain blocks the main goroutine by design).
	watchingMain atomic.Bool
	// manager is the workers serving now (s.workers, which the main
	// goroutine replaces on a rollback).
	manager atomic.Pointer[workers.Manager]
	// oldest is the time of the least recent heartbeat at the last look,
	// Unix nanoseconds: the owner's heartbeat (stats.Options.Liveness).
	oldest atomic.Int64

	missTotal, megaTotal stats.CounterLane
	loops                []*watchedLoop // 0: main; 1+n: worker n

	abort func(stacks string) // default: log and exit
	stop  chan struct{}
	done  chan struct{}
}

// watchedLoop is one loop's stats and the stall it is in, if any.
type watchedLoop struct {
	name           string
	miss, megaMiss stats.CounterLane
	age            stats.GaugeLane
	missed, mega   bool // within the current stall
	// missLog and megaLog keep a busy machine's short stalls, which are
	// counted every time, from flooding the log: a line per interval.
	missLog, megaLog ratelog.Limiter
}

func newWatchdog(cfg config.Watchdog, store *stats.Store, workerCount int, log hclog.Logger) *watchdog {
	w := &watchdog{cfg: cfg, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	w.oldest.Store(w.start.UnixNano())
	w.watchingMain.Store(true)
	w.missTotal = store.Counter("watchdog.miss").Lane(0)
	w.megaTotal = store.Counter("watchdog.mega_miss").Lane(0)
	loop := func(name string) *watchedLoop {
		return &watchedLoop{
			missLog:  ratelog.Limiter{Log: log},
			megaLog:  ratelog.Limiter{Log: log},
			name:     name,
			miss:     store.Counter("watchdog." + name + ".miss").Lane(0),
			megaMiss: store.Counter("watchdog." + name + ".mega_miss").Lane(0),
			age:      store.Gauge("watchdog."+name+".heartbeat_age_ms", stats.GaugeNewest).Lane(0),
		}
	}
	w.loops = append(w.loops, loop("main"))
	for i := range workerCount {
		w.loops = append(w.loops, loop("worker."+strconv.Itoa(i)))
	}
	return w
}

// interval is how often the main loop beats and the watchdog looks.
func (w *watchdog) interval() time.Duration { return max(w.cfg.MissTimeout.D()/2, time.Millisecond) }

// beatMain is the main loop's heartbeat.
func (w *watchdog) beatMain() { w.mainBeat.Store(int64(time.Since(w.start))) }

// liveness is the owner's heartbeat: when the least recent loop last beat;
// once the watchdog has stopped (the generation stops, and no supervisor
// judges it by its heartbeat), the time of asking.
func (w *watchdog) liveness() time.Time {
	select {
	case <-w.done:
		return time.Now()
	default:
		return time.Unix(0, w.oldest.Load())
	}
}

// run looks at the heartbeats until stop is closed.
func (w *watchdog) run(s *Server) {
	defer close(w.done)
	t := time.NewTicker(w.interval())
	defer t.Stop()
	var ages []time.Duration
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		ages = w.look(s, ages)
	}
}

// look checks every loop once and publishes the owner's heartbeat.
func (w *watchdog) look(s *Server, ages []time.Duration) []time.Duration {
	now := time.Now()
	oldest := time.Duration(0)
	check := func(l *watchedLoop, age time.Duration) {
		l.age.Set(age.Milliseconds())
		oldest = max(oldest, age)
		w.judge(s, l, age)
	}
	if w.watchingMain.Load() {
		check(w.loops[0], time.Duration(int64(time.Since(w.start))-w.mainBeat.Load()))
	}
	if m := w.manager.Load(); m != nil && s.State() == StateLive {
		ages = m.WorkerHeartbeatAges(ages)
		for i, age := range ages {
			if 1+i < len(w.loops) {
				check(w.loops[1+i], age)
			}
		}
	}
	w.oldest.Store(now.Add(-oldest).UnixNano())
	if s.region != nil {
		s.region.HeartbeatAt(w.liveness())
	}
	return ages
}

// judge counts and acts on one loop's heartbeat age.
func (w *watchdog) judge(s *Server, l *watchedLoop, age time.Duration) {
	if age <= w.cfg.MissTimeout.D() {
		if l.mega {
			s.log.Info("watchdog: loop beats again", "loop", l.name)
		}
		l.missed, l.mega = false, false
		return
	}
	if !l.missed {
		l.missed = true
		l.miss.Inc()
		w.missTotal.Inc()
		l.missLog.Warn("watchdog: a loop missed its heartbeat", "loop", l.name, "age", age.Round(time.Millisecond),
			"miss_timeout", w.cfg.MissTimeout.D())
	}
	if !l.mega && age > w.cfg.MegaMissTimeout.D() {
		l.mega = true
		l.megaMiss.Inc()
		w.megaTotal.Inc()
		l.megaLog.Warn("watchdog: a loop is stuck (mega miss)", "loop", l.name, "age", age.Round(time.Millisecond),
			"mega_miss_timeout", w.cfg.MegaMissTimeout.D())
	}
	if kill := w.cfg.KillTimeout.D(); kill > 0 && age > kill {
		w.abort(fmt.Sprintf("watchdog: loop %s has not beaten for %s (kill_timeout %s): aborting the generation",
			l.name, age.Round(time.Millisecond), kill))
	}
}

// allStacks is every goroutine's stack, however many there are (bounded
// at 64 MiB).
func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// startWatchdog starts the watchdog on the workers that serve now; Run
// calls it once the generation is live.
func (s *Server) startWatchdog() {
	w := s.wd
	w.manager.Store(s.workers)
	w.beatMain()
	if w.abort == nil {
		w.abort = func(why string) {
			s.log.Error(why, "goroutines", "\n"+allStacks())
			os.Exit(exitWatchdogKill)
		}
	}
	go w.run(s)
}

// stopWatchdog ends the watchdog; Run calls it when its loop ends.
func (s *Server) stopWatchdog() {
	s.wd.watchingMain.Store(false)
	select {
	case <-s.wd.stop:
	default:
		close(s.wd.stop)
		<-s.wd.done
	}
}

// exitWatchdogKill is the exit status of a generation the watchdog
// aborted (kill_timeout): not 0, so that the supervisor replaces it.
const exitWatchdogKill = 70
