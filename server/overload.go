package server

import (
	"maps"
	"math"
	"net/http"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/resmon"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/workers"
)

// The overload manager (DESIGN §3d, Envoy's overload manager). Once per
// [overload] interval, on the main goroutine, it reads the resource
// monitors, turns each action's trigger into a scale from 0 to 1, and
// publishes what the workers must do as one immutable state per worker
// (workers.Manager.SetOverload); the actions that are the main
// goroutine's own (the Go memory limit, resetting connections, closing
// shrunk-idle ones) it does itself.
//
// Stats (GaugeNewest, lane 0):
//
//	overload.<action>.active                     1 while the action acts
//	overload.<action>.scale_percent              its scale, 0 to 100
//	overload.monitor.<monitor>.pressure_percent  the monitor's pressure, 0 to 100 (and more)
//
// and the workers' counters (workers/overload.go): overload.shed_total and
// one count per shedding action.

// overloadLogEvery bounds how often one action's start or stop is
// logged: an action that flaps around its threshold logs once per
// interval, with the number of changes held back.
const overloadLogEvery = 10 * time.Second

// cgroupRefind is how often the cgroup memory monitor looks for its
// cgroup again while it knows no limit.
const cgroupRefind = time.Second

// overloadMonitor is one resource monitor.
type overloadMonitor struct {
	name string
	// read returns the pressure (used / limit, 0 when the limit is
	// unknown or none), and what it is made of for GET /overload.
	read     func() (pressure float64, used, limit uint64, err error)
	pressure float64
	used     uint64
	limit    uint64
	err      error
	gauge    stats.GaugeLane
	// warned: a monitor that cannot read is warned about once.
	warned bool
	// watched: some action's trigger names it (only those are read).
	watched bool
}

// overloadAction is one configured action and its trigger.
type overloadAction struct {
	name     string
	from, to float64 // the trigger's range; a threshold has from == to
	monitors []*overloadMonitor
	// scale is 0 to 1: the trigger's progress through its range. An
	// action that cannot act by degrees acts at 1 (saturated).
	scale  float64
	active bool
	since  time.Time
	// Logging of starts and stops (see overloadLogEvery).
	logged     bool // the state last logged
	loggedAt   time.Time
	heldBack   int
	activeG    stats.GaugeLane
	scaleG     stats.GaugeLane
	byDegrees  bool // shrink_timeouts: acts on any scale > 0
	startCount uint64
}

// overloadManager is the generation's overload manager; nil when
// [overload] configures no action.
type overloadManager struct {
	log      hclog.Logger
	cfg      config.Overload
	workers  *workers.Manager
	monitors []*overloadMonitor
	actions  map[string]*overloadAction
	order    []*overloadAction

	heap       *resmon.Heap
	heapLive   uint64
	heapInUse  uint64
	runtimeMem uint64 // what the Go memory limit bounds
	gcCycles   uint64 // garbage collections completed, at the last read
	// resetAfterGC: the last reset pass happened at this many GC cycles;
	// the next waits for a collection since (see pass).
	resetAfterGC    uint64
	resetOnce       bool
	peakHeapLive    uint64
	peakHeapInUse   uint64
	cgroupLimit     uint64 // the cgroup's memory limit at the last read (0: none)
	baseMemoryLimit int64  // debug.SetMemoryLimit's value at start, restored
	lastFreeOS      time.Time
	resetTotal      uint64
	// refusedInKernel and closedAtAccept are stop_accepting's two
	// counters (workers/overload.go), for GET /overload.
	refusedInKernel *stats.Counter
	closedAtAccept  *stats.Counter
	lastState       workers.OverloadState // the state last published
	published       bool
	passes          uint64
	// report is the last pass's state, for GET /overload (another
	// goroutine).
	report atomic.Pointer[OverloadReport]
}

// OverloadReport is the body of GET /overload.
type OverloadReport struct {
	Enabled  bool                    `json:"enabled"`
	Interval string                  `json:"interval,omitempty"`
	Monitors []OverloadMonitorReport `json:"monitors,omitempty"`
	Actions  []OverloadActionReport  `json:"actions,omitempty"`
	// HeapLiveBytes is the live heap at the last GC; the peaks are
	// over the generation's life, read once per interval.
	HeapLiveBytes      uint64 `json:"heap_live_bytes"`
	HeapInUseBytes     uint64 `json:"heap_in_use_bytes"`
	PeakHeapLiveBytes  uint64 `json:"peak_heap_live_bytes"`
	PeakHeapInUseBytes uint64 `json:"peak_heap_in_use_bytes"`
	// GoMemoryLimit is debug.SetMemoryLimit's value now.
	GoMemoryLimit    int64  `json:"go_memory_limit"`
	ConnectionsReset uint64 `json:"connections_reset"`
	Passes           uint64 `json:"passes"`
	// StopAccepting says how stop_accepting refuses new connections;
	// absent when the action is not configured.
	StopAccepting *StopAcceptingReport `json:"stop_accepting,omitempty"`
}

// StopAcceptingReport is stop_accepting's mode in GET /overload.
type StopAcceptingReport struct {
	// Mode is "kernel" (the steering program refuses new connections
	// in the kernel: connect fails with ECONNREFUSED), "accept" (they
	// are accepted and reset at once), or "mixed" (some listeners
	// each): Listeners has it by listener.
	Mode      string            `json:"mode"`
	Listeners map[string]string `json:"listeners"`
	// RefusedInKernel is overload.stop_accepting.refused,
	// ClosedAtAccept overload.stop_accepting.closed (this generation).
	RefusedInKernel uint64 `json:"refused_in_kernel"`
	ClosedAtAccept  uint64 `json:"closed_at_accept"`
}

// stopAcceptingMode sums up modes (by listener) as one word: the mode
// they share, or "mixed".
func stopAcceptingMode(modes map[string]string) string {
	mode := ""
	for _, m := range modes {
		if mode != "" && m != mode {
			return "mixed"
		}
		mode = m
	}
	return mode
}

// OverloadMonitorReport is one monitor in GET /overload.
type OverloadMonitorReport struct {
	Name            string  `json:"name"`
	PressurePercent float64 `json:"pressure_percent"`
	Used            uint64  `json:"used"`
	Limit           uint64  `json:"limit"` // 0: none known (no pressure)
	Error           string  `json:"error,omitempty"`
}

// OverloadActionReport is one configured action in GET /overload.
type OverloadActionReport struct {
	Name         string   `json:"name"`
	Active       bool     `json:"active"`
	ScalePercent float64  `json:"scale_percent"`
	Since        string   `json:"since,omitempty"`
	Trigger      []int    `json:"pressure_percent"`
	Monitors     []string `json:"monitors"`
	Started      uint64   `json:"started"` // times it started acting
}

// newOverloadManager builds the overload manager of cfg, or returns nil
// when no action is configured.
func newOverloadManager(cfg *config.Config, w *workers.Manager, st *stats.Store, log hclog.Logger) *overloadManager {
	oc := cfg.Overload
	if !oc.Enabled() {
		return nil
	}
	log = log.Named("overload")
	om := &overloadManager{
		log:             log,
		cfg:             oc,
		workers:         w,
		actions:         map[string]*overloadAction{},
		heap:            resmon.NewHeap(),
		baseMemoryLimit: debug.SetMemoryLimit(-1),
		refusedInKernel: st.Counter("overload.stop_accepting.refused"),
		closedAtAccept:  st.Counter("overload.stop_accepting.closed"),
	}
	g := func(name string) stats.GaugeLane { return st.Gauge(name, stats.GaugeNewest).Lane(0) }
	byName := map[string]*overloadMonitor{}
	addMonitor := func(name string, read func() (float64, uint64, uint64, error)) {
		m := &overloadMonitor{name: name, read: read, gauge: g("overload.monitor." + name + ".pressure_percent")}
		om.monitors = append(om.monitors, m)
		byName[name] = m
	}
	heapLimit := uint64(oc.HeapLimitMiB) << 20
	addMonitor(config.MonitorHeap, func() (float64, uint64, uint64, error) {
		r := om.heap.Read()
		om.heapLive, om.heapInUse, om.runtimeMem, om.gcCycles = r.Live, r.InUse, r.Runtime, r.GCCycles
		om.peakHeapLive = max(om.peakHeapLive, om.heapLive)
		om.peakHeapInUse = max(om.peakHeapInUse, om.heapInUse)
		// The heap in use, garbage not yet swept included: it grows
		// with every allocation, where the live heap is only known at
		// the end of a collection, too late for a burst of connections.
		if heapLimit == 0 {
			return 0, om.heapInUse, 0, nil
		}
		return float64(om.heapInUse) / float64(heapLimit), om.heapInUse, heapLimit, nil
	})
	cg, cgErr := resmon.FindCgroupMemory()
	cgFound := time.Now()
	addMonitor(config.MonitorCgroupMemory, func() (float64, uint64, uint64, error) {
		// Without a limit (or a cgroup), look again now and then: a
		// process moved into another cgroup (by systemd, a container
		// runtime, an operator) is then measured against that one's.
		if (cgErr != nil || om.cgroupLimit == 0) && time.Since(cgFound) >= cgroupRefind {
			cg, cgErr = resmon.FindCgroupMemory()
			cgFound = time.Now()
		}
		if cgErr != nil {
			return 0, 0, 0, cgErr
		}
		usage, limit, err := cg.Read()
		om.cgroupLimit = limit
		if err != nil || limit == 0 {
			return 0, usage, limit, err
		}
		return float64(usage) / float64(limit), usage, limit, nil
	})
	addMonitor(config.MonitorConnections, func() (float64, uint64, uint64, error) {
		open, bound := w.OpenConnections()
		if bound <= 0 {
			return 0, uint64(open), 0, nil
		}
		return float64(open) / float64(bound), uint64(open), uint64(bound), nil
	})
	addMonitor(config.MonitorFileDescriptors, func() (float64, uint64, uint64, error) {
		n, err := resmon.OpenFDs()
		if err != nil {
			return 0, 0, 0, err
		}
		limit, err := resmon.FDLimit()
		if err != nil || limit == 0 || limit > math.MaxInt32 {
			return 0, uint64(n), 0, err
		}
		return float64(n) / float64(limit), uint64(n), limit, nil
	})
	for _, a := range oc.Actions() {
		if a.Trigger == nil {
			continue
		}
		from, to := a.Trigger.Range()
		act := &overloadAction{
			name: a.Name, from: from, to: to,
			activeG:   g("overload." + a.Name + ".active"),
			scaleG:    g("overload." + a.Name + ".scale_percent"),
			byDegrees: a.Name == config.ActionShrinkTimeouts,
		}
		for _, mn := range a.Trigger.Monitors {
			byName[mn].watched = true
			act.monitors = append(act.monitors, byName[mn])
		}
		om.actions[a.Name] = act
		om.order = append(om.order, act)
	}
	names := make([]string, 0, len(om.order))
	for _, a := range om.order {
		names = append(names, a.name)
	}
	args := []any{"interval", oc.Interval.D(), "actions", names, "heap_limit_mib", oc.HeapLimitMiB}
	if om.actions[config.ActionStopAccepting] != nil {
		modes := w.StopAcceptingModes()
		args = append(args, "stop_accepting", stopAcceptingMode(modes))
		for _, name := range slices.Sorted(maps.Keys(modes)) {
			args = append(args, "stop_accepting."+name, modes[name])
		}
	}
	if cgErr != nil {
		args = append(args, "cgroup", cgErr.Error())
	} else {
		args = append(args, "cgroup", cg.Dir, "cgroup_version", cg.Version)
	}
	log.Info("overload manager on", args...)
	om.report.Store(&OverloadReport{Enabled: true, Interval: oc.Interval.D().String()})
	return om
}

// follow makes the manager act on m, the workers that serve now (a
// listener change replaced them), which get the state last published.
func (om *overloadManager) follow(m *workers.Manager) {
	if om == nil {
		return
	}
	om.workers = m
	if om.published {
		m.SetOverload(om.lastState)
	}
}

// pass is one interval's work: read, decide, publish, act.
func (om *overloadManager) pass(now time.Time) {
	om.passes++
	om.workers.AdvanceOverloadPass()
	for _, m := range om.monitors {
		if !m.watched {
			continue // no action watches it: not read
		}
		m.pressure, m.used, m.limit, m.err = m.read()
		if m.err != nil && !m.warned {
			m.warned = true // once: a monitor that cannot read stays so
			om.log.Warn("overload monitor cannot read its resource; it reports no pressure", "monitor", m.name, "error", m.err)
		}
		m.gauge.Set(int64(math.Round(m.pressure * 100)))
	}
	for _, a := range om.order {
		p := 0.0
		for _, m := range a.monitors {
			p = max(p, m.pressure)
		}
		switch {
		case p >= a.to:
			a.scale = 1
		case p < a.from || a.to == a.from:
			a.scale = 0
		default:
			a.scale = (p - a.from) / (a.to - a.from)
		}
		active := a.scale >= 1 || (a.byDegrees && a.scale > 0)
		if active != a.active {
			a.active = active
			a.since = now
			if active {
				a.startCount++
			}
		}
		om.logTransition(a, p, now)
		a.activeG.Set(boolGauge(a.active))
		a.scaleG.Set(int64(math.Round(a.scale * 100)))
	}

	st := workers.OverloadState{
		StopAccepting:    om.isActive(config.ActionStopAccepting),
		RefuseRequests:   om.isActive(config.ActionRefuseRequests),
		DisableKeepAlive: om.isActive(config.ActionDisableKeepAlive),
		RetryAfter:       om.cfg.RetryAfter.D(),
	}
	if a := om.actions[config.ActionShrinkTimeouts]; a != nil && a.active {
		minP := float64(om.cfg.TimeoutMinPercent)
		st.TimeoutPercent = max(int(math.Round(100-a.scale*(100-minP))), 1)
		if st.TimeoutPercent >= 100 {
			st.TimeoutPercent = 99
		}
	}
	if !om.published || st != om.lastState {
		// Only a change is published: the workers' words stay in their
		// caches between changes.
		om.workers.SetOverload(st)
		om.lastState, om.published = st, true
	}
	// What the steering programs refused in the kernel, into the
	// overload counters once per pass (SetOverload counts too).
	om.workers.CountKernelRefusals()

	if st.TimeoutPercent > 0 {
		om.workers.CloseIdleShrunk(st.TimeoutPercent)
	}
	om.shrinkHeap(now)
	// Reset connections, but not again before a garbage collection has
	// run since the last reset pass: what a reset frees stays in the
	// heap in use until then, and resetting on that stale pressure would
	// cut ever younger connections, the well-behaved among them. Without
	// the heap monitor (cgroup memory, connections) the same wait lets
	// the freed memory show.
	if om.isActive(config.ActionResetConnections) {
		om.resetConnections()
	}
	om.publishReport(now)
}

// resetConnections is one pass of reset_connections (see pass).
func (om *overloadManager) resetConnections() {
	if !om.monitorByName(config.MonitorHeap).watched {
		om.gcCycles = om.heap.Read().GCCycles
	}
	if om.resetOnce && om.gcCycles <= om.resetAfterGC {
		return
	}
	om.resetOnce, om.resetAfterGC = true, om.gcCycles
	minPasses := int((om.cfg.ResetMinBusy.D() + om.cfg.Interval.D() - 1) / om.cfg.Interval.D())
	om.resetTotal += uint64(om.workers.ResetBiggest(om.cfg.ResetPerPass, max(minPasses, 1)))
}

func (om *overloadManager) monitorByName(name string) *overloadMonitor {
	for _, m := range om.monitors {
		if m.name == name {
			return m
		}
	}
	return nil
}

func (om *overloadManager) isActive(name string) bool {
	a := om.actions[name]
	return a != nil && a.active
}

// shrinkHeap lowers the Go memory limit while shrink_heap acts, and gives
// free memory back to the OS at its start and then at most every few
// seconds (FreeOSMemory runs a whole collection); it restores the limit
// the process started with when the action stops.
func (om *overloadManager) shrinkHeap(now time.Time) {
	a := om.actions[config.ActionShrinkHeap]
	if a == nil {
		return
	}
	if !a.active {
		if debug.SetMemoryLimit(-1) != om.baseMemoryLimit {
			debug.SetMemoryLimit(om.baseMemoryLimit)
		}
		return
	}
	// The Go memory limit bounds all the runtime's memory, stacks
	// included; heap_limit_mib bounds the heap. So the limit from the
	// heap monitor is the runtime's memory outside the heap plus the
	// share of heap_limit_mib; from the cgroup, the share of its limit.
	pct := uint64(om.cfg.MemoryLimitPercent)
	var limit uint64
	if heapLimit := uint64(om.cfg.HeapLimitMiB) << 20; heapLimit > 0 {
		limit = om.runtimeMem - min(om.heapInUse, om.runtimeMem) + heapLimit/100*pct
	}
	if om.cgroupLimit > 0 && (limit == 0 || om.cgroupLimit/100*pct < limit) {
		limit = om.cgroupLimit / 100 * pct
	}
	if limit > 0 && debug.SetMemoryLimit(-1) != int64(limit) {
		debug.SetMemoryLimit(int64(limit))
	}
	if now.Sub(om.lastFreeOS) >= 5*time.Second {
		om.lastFreeOS = now
		debug.FreeOSMemory()
	}
}

// logTransition logs an action's start or stop, at most once per
// overloadLogEvery per action; a change held back is logged (as the state
// then current, with how many were held back) once the interval is over.
func (om *overloadManager) logTransition(a *overloadAction, pressure float64, now time.Time) {
	if a.active == a.logged {
		return
	}
	if !a.loggedAt.IsZero() && now.Sub(a.loggedAt) < overloadLogEvery {
		a.heldBack++
		return
	}
	args := []any{"action", a.name, "pressure_percent", math.Round(pressure * 100), "scale_percent", math.Round(a.scale * 100)}
	for _, m := range a.monitors {
		if m.limit > 0 {
			args = append(args, m.name+"_percent", math.Round(m.pressure*100))
		}
	}
	if a.heldBack > 0 {
		args = append(args, "changes_held_back", a.heldBack)
	}
	if a.active {
		om.log.Warn("overload action started", args...)
	} else {
		om.log.Info("overload action stopped", args...)
	}
	a.logged, a.loggedAt, a.heldBack = a.active, now, 0
}

func (om *overloadManager) publishReport(now time.Time) {
	r := &OverloadReport{
		Enabled:            true,
		Interval:           om.cfg.Interval.D().String(),
		HeapLiveBytes:      om.heapLive,
		HeapInUseBytes:     om.heapInUse,
		PeakHeapLiveBytes:  om.peakHeapLive,
		PeakHeapInUseBytes: om.peakHeapInUse,
		GoMemoryLimit:      debug.SetMemoryLimit(-1),
		ConnectionsReset:   om.resetTotal,
		Passes:             om.passes,
	}
	for _, m := range om.monitors {
		mr := OverloadMonitorReport{Name: m.name, PressurePercent: math.Round(m.pressure*1000) / 10, Used: m.used, Limit: m.limit}
		if m.err != nil {
			mr.Error = m.err.Error()
		}
		r.Monitors = append(r.Monitors, mr)
	}
	for _, a := range om.order {
		ar := OverloadActionReport{Name: a.name, Active: a.active, ScalePercent: math.Round(a.scale * 100), Started: a.startCount}
		if a.active {
			ar.Since = a.since.UTC().Format(time.RFC3339Nano)
		}
		ar.Trigger = []int{int(math.Round(a.from * 100))}
		if a.to != a.from {
			ar.Trigger = append(ar.Trigger, int(math.Round(a.to*100)))
		}
		for _, m := range a.monitors {
			ar.Monitors = append(ar.Monitors, m.name)
		}
		r.Actions = append(r.Actions, ar)
	}
	if om.actions[config.ActionStopAccepting] != nil {
		modes := om.workers.StopAcceptingModes()
		r.StopAccepting = &StopAcceptingReport{
			Mode:            stopAcceptingMode(modes),
			Listeners:       modes,
			RefusedInKernel: om.refusedInKernel.Value(),
			ClosedAtAccept:  om.closedAtAccept.Value(),
		}
	}
	om.report.Store(r)
}

// stop puts back what the manager changed in the process: the Go memory
// limit. The workers' state goes with the workers.
func (om *overloadManager) stop() {
	if om != nil {
		debug.SetMemoryLimit(om.baseMemoryLimit)
	}
}

// ticker returns the pass's channel, or nil (never ready) when off.
func (om *overloadManager) ticker() (<-chan time.Time, func()) {
	if om == nil {
		return nil, func() {}
	}
	t := time.NewTicker(om.cfg.Interval.D())
	return t.C, t.Stop
}

func (s *Server) handleOverload(w http.ResponseWriter, _ *http.Request) {
	r := &OverloadReport{}
	if s.overload != nil {
		r = s.overload.report.Load()
	}
	writeJSON(w, r)
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
