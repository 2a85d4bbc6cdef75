package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
)

// fakeTable is a process table that starts nothing: it hands out pids,
// records signals and notifications, and lets the test say when a
// generation is ready or exits. The machine's logic runs in microseconds.
type fakeTable struct {
	nextPID  int
	started  []*generation
	signals  []string // "SIGTERM 101"
	notified [][]string
	startErr error
}

func (f *fakeTable) start(g *generation, coldOK bool) error {
	if f.startErr != nil {
		return f.startErr
	}
	f.nextPID++
	g.pid, g.binary, g.version = 100+f.nextPID, "/fake/hotproxy", "test"
	g.startTime = uint64(g.pid) * 1000
	f.started = append(f.started, g)
	return nil
}

func (f *fakeTable) signal(g *generation, sig Signal) {
	f.signals = append(f.signals, fmt.Sprintf("%s %d", sig, g.pid))
}

func (f *fakeTable) notify(lines ...string) { f.notified = append(f.notified, lines) }
func (f *fakeTable) stopping()              {}

// fakeClock is a clock that moves only when the test says.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

type machineHarness struct {
	tb    testing.TB
	m     *machine
	table *fakeTable
	clock *fakeClock
}

// newMachineHarness returns a machine with epoch 0 started and serving.
func newMachineHarness(tb testing.TB, commitWindow time.Duration) *machineHarness {
	tb.Helper()
	cfg := &config.Config{}
	cfg.SetDefaults()
	cfg.HotRestart.CommitWindow = config.Duration(commitWindow)
	h := &machineHarness{tb: tb, table: &fakeTable{}, clock: &fakeClock{t: time.Unix(1_000_000, 0)}}
	h.m = newMachine(h.table, cfg, hclog.NewNullLogger())
	h.m.now = h.clock.now
	h.m.op = &reloadOp{initial: true}
	if err := h.m.spawn(h.m.op, false); err != nil {
		tb.Fatal(err)
	}
	h.ready(h.newest())
	return h
}

func (h *machineHarness) newest() *generation {
	h.tb.Helper()
	if len(h.table.started) == 0 {
		h.tb.Fatal("no generation was started")
	}
	return h.table.started[len(h.table.started)-1]
}

func (h *machineHarness) ready(g *generation) {
	h.tb.Helper()
	h.m.onReady(readyMsg{gen: g, line: fmt.Sprintf("READY %d", g.pid)})
}

// tick runs the machine's time-driven work and fails on an error.
func (h *machineHarness) tick() time.Time {
	h.tb.Helper()
	wake, err := h.m.tick()
	if err != nil {
		h.tb.Fatal(err)
	}
	return wake
}

func (h *machineHarness) states() string {
	var s []string
	for _, g := range h.m.gens {
		s = append(s, fmt.Sprintf("%d:%s", g.epoch, g.state))
	}
	return strings.Join(s, " ")
}

func (h *machineHarness) wantStates(want string) {
	h.tb.Helper()
	if got := h.states(); got != want {
		h.tb.Fatalf("generations: got %q, want %q", got, want)
	}
}

func TestMachineReloadsCoalesce(t *testing.T) {
	h := newMachineHarness(t, 0)
	first := make(chan ReloadResult, 1)
	h.m.requestReload(first, false)
	h.tick()
	if len(h.table.started) != 2 {
		t.Fatalf("started %d generations, want 2 (epoch 0 and the reload)", len(h.table.started))
	}
	// Three more while epoch 1 starts: they fold into one.
	var later []chan ReloadResult
	for range 3 {
		c := make(chan ReloadResult, 1)
		later = append(later, c)
		h.m.requestReload(c, false)
		h.tick()
	}
	if len(h.table.started) != 2 {
		t.Fatalf("a reload started while one was starting: %d generations started", len(h.table.started))
	}
	h.ready(h.newest())
	if r := <-first; !r.OK || r.Epoch != 1 {
		t.Fatalf("first reload: %+v, want epoch 1 OK", r)
	}
	h.tick()
	if len(h.table.started) != 3 {
		t.Fatalf("the coalesced reload did not start: %d generations started, want 3", len(h.table.started))
	}
	h.ready(h.newest())
	for i, c := range later {
		if r := <-c; !r.OK || r.Epoch != 2 {
			t.Errorf("coalesced reload %d: %+v, want epoch 2 OK", i, r)
		}
	}
	h.wantStates("0:draining 1:draining 2:serving")
	if h.m.reloads != 2 {
		t.Errorf("reloads counted: %d, want 2", h.m.reloads)
	}
}

// TestMachineTellsEachGenerationItsParent: a reload's generation is told
// the serving one by pid and start time, from the machine's own table; a
// cold start after a crash is told that none serves, so that it dials
// nothing (whatever another user bound on the dead one's name).
func TestMachineTellsEachGenerationItsParent(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	g0 := h.m.serving()
	if g0.parent != parentNone {
		t.Fatalf("epoch 0: parent %v, want none", g0.parent)
	}
	h.m.requestReload(nil, false)
	h.tick()
	g1 := h.newest()
	if g1.parent != parentGeneration || g1.parentPID != g0.pid || g1.parentStartTime != g0.startTime || g0.startTime == 0 {
		t.Fatalf("reload: parent %v pid %d start %d, want the serving generation's pid %d start %d",
			g1.parent, g1.parentPID, g1.parentStartTime, g0.pid, g0.startTime)
	}
	h.ready(g1)
	h.clock.advance(10 * time.Second) // past g0's commit window: no rollback
	h.m.onExit(g1, exit{how: "killed by SIGKILL"})
	h.clock.t = h.tick()
	h.tick()
	g2 := h.newest()
	if g2 == g1 || g2.epoch != 2 {
		t.Fatalf("no cold start after the serving generation was killed (%s)", h.states())
	}
	if g2.parent != parentNone || g2.parentPID != 0 {
		t.Fatalf("cold start after a crash: parent %v pid %d, want none", g2.parent, g2.parentPID)
	}
}

func TestMachineCrashBackoff(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	var delays []time.Duration
	for i := range MaxCrashRestarts {
		g := h.m.serving()
		if g == nil {
			t.Fatalf("crash %d: nothing serves (%s)", i, h.states())
		}
		h.m.onExit(g, exit{how: "killed by SIGSEGV"})
		before := len(h.table.started)
		wake := h.tick()
		if len(h.table.started) != before {
			t.Fatalf("crash %d: restarted at once, without back-off", i)
		}
		delays = append(delays, wake.Sub(h.clock.now()))
		h.clock.t = wake
		h.tick()
		if len(h.table.started) != before+1 {
			t.Fatalf("crash %d: not restarted once the back-off passed", i)
		}
		h.ready(h.newest())
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}
	if !slices.Equal(delays, want) {
		t.Fatalf("back-off delays %v, want %v", delays, want)
	}
	// One more within CrashWindow: the supervisor gives up.
	h.m.onExit(h.m.serving(), exit{how: "killed by SIGSEGV"})
	if !h.m.stopping || h.m.exitErr == nil || !strings.Contains(h.m.exitErr.Error(), "giving up") {
		t.Fatalf("after %d crashes: stopping=%v exitErr=%v, want giving up", MaxCrashRestarts+1, h.m.stopping, h.m.exitErr)
	}
}

func TestMachineCrashesOutsideTheWindowAreForgotten(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	for i := range 3 * MaxCrashRestarts {
		h.m.onExit(h.m.serving(), exit{how: "exit status 2"})
		h.clock.t = h.tick()
		h.tick()
		h.ready(h.newest())
		h.clock.advance(CrashWindow)
		if h.m.stopping {
			t.Fatalf("gave up after crash %d although each came a crash window after the last", i)
		}
	}
}

func TestMachineRollbackWithinCommitWindow(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	g0 := h.m.serving()
	h.m.requestReload(nil, false)
	h.tick()
	g1 := h.newest()
	h.ready(g1)
	h.wantStates("0:draining 1:serving")
	h.clock.advance(2 * time.Second)
	h.m.onExit(g1, exit{how: "killed by SIGKILL"})
	h.wantStates("0:serving")
	if h.m.serving() != g0 {
		t.Fatal("epoch 0 does not serve again")
	}
	if h.m.op != nil || len(h.table.started) != 2 {
		t.Fatalf("a rollback started a cold generation: op=%v started=%d", h.m.op, len(h.table.started))
	}
	if h.m.lastFailure == nil || !strings.Contains(h.m.lastFailure.Reason, "epoch 1") {
		t.Errorf("last failure %+v does not name epoch 1", h.m.lastFailure)
	}
	// One reload, rolled back: one failed, none ok (it used to count as
	// both, or as ok only when nobody waited for its commit).
	if h.m.reloads != 0 || h.m.failed != 1 {
		t.Errorf("after a rolled-back reload: %d ok, %d failed; want 0 ok, 1 failed", h.m.reloads, h.m.failed)
	}
}

func TestMachineDeathAfterCommitWindowRestartsCold(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	h.m.requestReload(nil, false)
	h.tick()
	g1 := h.newest()
	h.ready(g1)
	h.clock.advance(5 * time.Second) // past the commit window (and its second of slack)
	h.m.onExit(g1, exit{how: "killed by SIGKILL"})
	if h.m.serving() != nil {
		t.Fatalf("the drained epoch 0 was made to serve after its commit window: %s", h.states())
	}
	if h.m.op == nil || !h.m.op.crash {
		t.Fatal("no cold restart was scheduled")
	}
}

func TestMachineFailedReloadLeavesServingAlone(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	res := make(chan ReloadResult, 1)
	h.m.requestReload(res, false)
	h.tick()
	g1 := h.newest()
	h.m.onReady(readyMsg{gen: g1, line: "FAILED listener \"web\": bind: address already in use"})
	r := <-res
	if r.OK || r.ServingEpoch != 0 || !strings.Contains(r.Error, "address already in use") {
		t.Fatalf("result %+v: want a failure that names the reason, epoch 0 still serving", r)
	}
	if !slices.Contains(h.table.signals, fmt.Sprintf("SIGKILL %d", g1.pid)) {
		t.Errorf("the failed generation was not killed: signals %v", h.table.signals)
	}
	h.wantStates("0:serving 1:failed")
	// The next reload waits until the failed one is reaped, then retries
	// the same epoch.
	h.m.requestReload(nil, false)
	h.tick()
	if len(h.table.started) != 2 {
		t.Fatal("a reload started while a failed generation was not yet reaped")
	}
	h.m.onExit(g1, exit{how: "killed by SIGKILL"})
	h.tick()
	if g := h.newest(); g == g1 || g.epoch != 1 {
		t.Fatalf("retry started epoch %d, want epoch 1 again", g.epoch)
	}
}

// reload asks for a reload, starts it and makes its generation ready.
func (h *machineHarness) reload() *generation {
	h.tb.Helper()
	res := make(chan ReloadResult, 1)
	before := len(h.table.started)
	h.m.requestReload(res, false)
	h.tick()
	if len(h.table.started) != before+1 {
		h.tb.Fatal("the reload did not start a generation at once")
	}
	g := h.newest()
	h.ready(g)
	if r := <-res; !r.OK {
		h.tb.Fatalf("reload: %+v", r)
	}
	return g
}

func (h *machineHarness) signalled(g *generation, sig Signal) bool {
	return slices.Contains(h.table.signals, fmt.Sprintf("%s %d", sig, g.pid))
}

// TestMachineReloadDoesNotWaitForTheCommitWindow: reloads in a burst each
// start at once, whatever the commit window (issue 11).
func TestMachineReloadDoesNotWaitForTheCommitWindow(t *testing.T) {
	h := newMachineHarness(t, time.Hour)
	for range 3 {
		h.reload()
		h.clock.advance(100 * time.Millisecond)
	}
	h.wantStates("0:draining 1:draining 2:draining 3:serving")
}

func TestMachineHurriesTheOldestDraining(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	h.m.cfg.HotRestart.MaxDrainingGenerations = 2
	gens := []*generation{h.m.serving(), h.reload(), h.reload(), h.reload()}
	// Epochs 0..2 drain, 3 serves: the oldest is hurried, and only it.
	for i, g := range gens {
		if got, want := h.signalled(g, SignalTerm), i == 0; got != want {
			t.Errorf("epoch %d: hurried %v, want %v (signals %v)", g.epoch, got, want, h.table.signals)
		}
	}
	// The newest draining one stays the rollback target.
	h.m.onExit(gens[3], exit{how: "killed by SIGSEGV"})
	if h.m.serving() != gens[2] {
		t.Fatalf("after the newest died: %s, want epoch 2 serving again", h.states())
	}
}

// TestMachineReloadWaitsForRoom: at max_draining_generations + 2 alive, a
// reload hurries the oldest draining generation and starts only once it
// has exited: never more generations alive than the bound.
func TestMachineReloadWaitsForRoom(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	h.m.cfg.HotRestart.MaxDrainingGenerations = 1
	g0 := h.m.serving()
	h.reload() // 0 drains, 1 serves
	h.m.requestReload(nil, false)
	h.tick()
	if len(h.table.started) != 3 {
		t.Fatal("a reload with room did not start")
	}
	g2 := h.newest()
	h.ready(g2) // 0 and 1 drain: 0 is hurried
	if !h.signalled(g0, SignalTerm) {
		t.Fatalf("epoch 0 not hurried: %v", h.table.signals)
	}
	if w := h.m.waiting(); w != "" {
		t.Fatalf("waiting() = %q with no reload waiting", w)
	}
	h.m.requestReload(nil, false)
	h.tick()
	if len(h.table.started) != 3 || len(h.m.gens) != 3 {
		t.Fatalf("a reload started with %d generations alive, bound %d", len(h.m.gens), h.m.aliveLimit())
	}
	// What `hotproxy reload` prints meanwhile: the bound, who it waits
	// for since when, and for how long at most.
	h.clock.advance(1500 * time.Millisecond)
	w := h.m.waiting()
	for _, want := range []string{"max_draining_generations = 1", fmt.Sprintf("epoch 0 (pid %d, told to stop 1.5s ago) has exited", g0.pid),
		"server.drain_time (30s)", "server.parent_shutdown_time (45s)"} {
		if !strings.Contains(w, want) {
			t.Errorf("waiting() = %q, lacks %q", w, want)
		}
	}
	h.m.onExit(g0, exit{how: "exit status 0", clean: true})
	h.tick()
	if len(h.table.started) != 4 {
		t.Fatal("the reload did not start once the hurried generation had exited")
	}
	if w := h.m.waiting(); w != "" {
		t.Errorf("waiting() = %q once the reload started", w)
	}
	if len(h.m.gens) > h.m.aliveLimit() {
		t.Fatalf("%d generations alive, bound %d", len(h.m.gens), h.m.aliveLimit())
	}
}

// TestMachineRollbackWhileOlderGenerationsDrain: the newest dies within
// its commit window while two older ones drain: the one it took over from
// serves again, not an older one.
func TestMachineRollbackWhileOlderGenerationsDrain(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	h.reload()
	g2 := h.reload()
	g3 := h.reload()
	h.wantStates("0:draining 1:draining 2:draining 3:serving")
	h.clock.advance(time.Second)
	h.m.onExit(g3, exit{how: "killed by SIGKILL"})
	if h.m.serving() != g2 {
		t.Fatalf("after epoch 3 died: %s, want epoch 2 serving", h.states())
	}
	if h.m.op != nil {
		t.Fatal("a rollback started a cold generation")
	}
}

// TestMachineGenerationStartedBeforeARollbackStopsTheRolledBack: epoch 2
// starts from epoch 1; epoch 1 dies in its commit window, so epoch 0 serves
// again; then epoch 2 serves. Epoch 0 was never told to drain by it: the
// supervisor stops it, or two generations would serve.
func TestMachineGenerationStartedBeforeARollbackStopsTheRolledBack(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	g0 := h.m.serving()
	g1 := h.reload()
	h.m.requestReload(nil, false)
	h.tick()
	g2 := h.newest()
	h.m.onExit(g1, exit{how: "killed by SIGKILL"})
	if h.m.serving() != g0 {
		t.Fatalf("after epoch 1 died: %s, want epoch 0 serving", h.states())
	}
	h.ready(g2)
	if !h.signalled(g0, SignalTerm) {
		t.Fatalf("epoch 0 was not told to stop once epoch 2 served: signals %v", h.table.signals)
	}
	h.wantStates("0:draining 2:serving")
}

// TestMachineReloadWaitingForTheCommit: a reload asked with waitCommit is
// answered only once its generation has served for the commit window;
// one whose generation dies inside the window is a failure that names the
// rollback; one superseded by a newer reload took effect.
func TestMachineReloadWaitingForTheCommit(t *testing.T) {
	h := newMachineHarness(t, 5*time.Second)
	pending := func(c chan ReloadResult) bool {
		select {
		case r := <-c:
			t.Fatalf("answered early: %+v", r)
		default:
		}
		return true
	}

	committed := make(chan ReloadResult, 1)
	h.m.requestReload(committed, true)
	h.tick()
	h.ready(h.newest())
	pending(committed)
	h.clock.advance(3 * time.Second)
	h.tick()
	pending(committed)
	h.clock.advance(3 * time.Second)
	h.tick()
	if r := <-committed; !r.OK || !r.Committed || r.Epoch != 1 {
		t.Fatalf("after the commit window: %+v, want epoch 1 committed", r)
	}

	rolledBack := make(chan ReloadResult, 1)
	h.m.requestReload(rolledBack, true)
	h.tick()
	g2 := h.newest()
	h.ready(g2)
	pending(rolledBack)
	h.clock.advance(time.Second)
	h.m.onExit(g2, exit{how: "exit status 3"})
	r := <-rolledBack
	if r.OK || r.ServingEpoch != 1 || !strings.Contains(r.Error, "died within its commit window") || !strings.Contains(r.Error, "rolled back to epoch 1") {
		t.Fatalf("a rolled-back reload answered %+v, want a failure naming the rollback to epoch 1", r)
	}

	superseded := make(chan ReloadResult, 1)
	h.m.requestReload(superseded, true)
	h.tick()
	h.ready(h.newest())
	h.reload()
	if r := <-superseded; !r.OK || !r.Committed {
		t.Fatalf("a reload superseded by a newer one answered %+v, want OK", r)
	}
}

// TestMachineFailedTakeOverNamesItsEpoch: with --take-over the first
// generation is past epoch 0 (after the one it takes over from); when it
// fails, the supervisor's error names that epoch, not "epoch 0".
func TestMachineFailedTakeOverNamesItsEpoch(t *testing.T) {
	cfg := &config.Config{}
	cfg.SetDefaults()
	table := &fakeTable{}
	m := newMachine(table, cfg, hclog.NewNullLogger())
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	m.now = clock.now
	m.lastEpoch = 2 // the running generation to take over from
	m.op = &reloadOp{initial: true}
	if err := m.spawn(m.op, true); err != nil {
		t.Fatal(err)
	}
	g := table.started[len(table.started)-1]
	if g.epoch != 3 {
		t.Fatalf("the take-over started epoch %d, want 3", g.epoch)
	}
	m.onReady(readyMsg{gen: g, line: "FAILED listener \"web\": bind: address already in use"})
	if m.exitErr == nil || !strings.Contains(m.exitErr.Error(), "epoch 3 did not start") || strings.Contains(m.exitErr.Error(), "epoch 0") {
		t.Fatalf("exit error %v, want it to name epoch 3", m.exitErr)
	}
}

// A generation that follows a control plane may wait initial_fetch_timeout
// for its first warm set before it reports ready (docs/xds.md): the
// supervisor's wait for readiness covers it, or every cold start of such
// a config with the control plane down failed ("not ready within 15s"
// against a 15s initial fetch: README's supervisor block did).
func TestReadyTimeoutCoversXDSInitialFetch(t *testing.T) {
	cfg := &config.Config{}
	cfg.HotRestart.HandoffTimeout = config.Duration(10 * time.Second)
	m := newMachine(nil, cfg, hclog.NewNullLogger())
	if got, want := m.readyTimeout(), 10*time.Second+DefaultReadyMargin; got != want {
		t.Fatalf("without [xds]: ready timeout %v, want %v", got, want)
	}
	cfg.XDS.Cluster = "control_plane"
	cfg.XDS.InitialFetchTimeout = config.Duration(40 * time.Second)
	if got, want := m.readyTimeout(), 40*time.Second+DefaultReadyMargin; got != want {
		t.Fatalf("with [xds] and a 40s initial fetch: ready timeout %v, want %v", got, want)
	}
	cfg.XDS.InitialFetchTimeout = config.Duration(time.Second)
	if got, want := m.readyTimeout(), 10*time.Second+DefaultReadyMargin; got != want {
		t.Fatalf("with [xds] and a 1s initial fetch: ready timeout %v, want %v (the hand-over's bound)", got, want)
	}
}

// TestMachineHoldsSignalsForAStartingGeneration: a SIGUSR1 (a rotated log)
// that arrives while a reload's generation starts goes to the serving one
// at once and to the starting one only once it is ready, and only once:
// before the new process has its handlers, SIGUSR1's default action kills
// it (the integration SIGHUP/SIGUSR1 flood saw "exited before it was
// ready (killed by SIGUSR1)").
func TestMachineHoldsSignalsForAStartingGeneration(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	serving := h.newest()
	res := make(chan ReloadResult, 1)
	h.m.requestReload(res, false)
	h.tick()
	starting := h.newest()
	if starting == serving || starting.state != StateStarting {
		t.Fatalf("no generation is starting: %s", h.states())
	}
	h.m.forward(SignalUser1)
	h.m.forward(SignalUser1)
	h.m.forward(SignalUser2)
	if !h.signalled(serving, SignalUser1) || !h.signalled(serving, SignalUser2) {
		t.Fatalf("the serving generation did not get the signals at once: %v", h.table.signals)
	}
	if h.signalled(starting, SignalUser1) || h.signalled(starting, SignalUser2) {
		t.Fatalf("a starting generation was signalled before it was ready: %v", h.table.signals)
	}
	h.ready(starting)
	if r := <-res; !r.OK {
		t.Fatalf("reload: %+v", r)
	}
	count := func(sig Signal) int {
		n := 0
		for _, s := range h.table.signals {
			if s == fmt.Sprintf("%s %d", sig, starting.pid) {
				n++
			}
		}
		return n
	}
	if count(SignalUser1) != 1 || count(SignalUser2) != 1 {
		t.Fatalf("once ready, the new generation got SIGUSR1 %d times and SIGUSR2 %d times, want once each: %v",
			count(SignalUser1), count(SignalUser2), h.table.signals)
	}
	h.m.forward(SignalUser1)
	if count(SignalUser1) != 2 {
		t.Fatalf("a ready generation's signal was held: %v", h.table.signals)
	}
}

// TestMachineDefersSignalReloadsForAReexec: while a re-execution waits
// for the machine to be idle, reloads nobody waits on (SIGHUP) are
// queued, not started, so a steady stream of them cannot keep it busy
// for ever (a SIGHUP flood held `reload --supervisor` for over 2 min);
// the deferred one is handed over, and a control-socket reload (someone
// waits on it) still runs.
func TestMachineDefersSignalReloadsForAReexec(t *testing.T) {
	h := newMachineHarness(t, time.Second)
	h.m.requestReload(nil, false) // a SIGHUP: starts at once
	h.tick()
	first := h.newest()
	h.m.deferReloads(true) // then `reload --supervisor`
	h.m.requestReload(nil, false)
	h.m.requestReload(nil, false)
	h.ready(first)
	h.tick()
	if h.m.op != nil || !h.m.idle() {
		t.Fatalf("after the reload in progress, a signal's reload started although a re-execution waits: op %+v", h.m.op)
	}
	if len(h.table.started) != 2 {
		t.Fatalf("%d generations started, want 2 (epoch 0 and the first reload)", len(h.table.started))
	}
	if !h.m.takeDeferredReload() {
		t.Fatal("the deferred reload is not handed to the new image")
	}
	if h.m.takeDeferredReload() {
		t.Fatal("the deferred reload was handed over twice")
	}

	// One with a waiter is not deferred.
	res := make(chan ReloadResult, 1)
	h.m.requestReload(res, false)
	h.tick()
	if h.m.op == nil {
		t.Fatal("a control-socket reload was deferred")
	}
	h.ready(h.newest())
	if r := <-res; !r.OK {
		t.Fatalf("reload: %+v", r)
	}

	// A re-execution that fails: what was deferred starts.
	h.m.requestReload(nil, false)
	if h.m.op != nil {
		t.Fatal("deferred reload started while deferring")
	}
	h.m.deferReloads(false)
	if h.m.op == nil {
		t.Fatal("the reload deferred for a re-execution that did not happen never started")
	}
}
