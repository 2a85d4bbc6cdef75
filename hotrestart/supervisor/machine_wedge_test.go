package supervisor

import (
	"slices"
	"testing"
	"time"
)

// TestMachineReplacesAWedgedGenerationOnTheKeptSockets: a wedged serving
// generation is left alone while its successor starts on the kept sockets
// (parentKept), and SIGKILLed only once that one serves.
func TestMachineReplacesAWedgedGenerationOnTheKeptSockets(t *testing.T) {
	h := newMachineHarness(t, 0)
	h.m.keptSockets = func() bool { return true }
	g0 := h.newest()
	h.m.onWedged(g0, 40*time.Second)
	h.wantStates("0:wedged")
	if slices.Contains(h.table.signals, "SIGKILL 101") {
		t.Fatal("the wedged generation was killed before a successor served")
	}
	h.clock.advance(time.Second) // the crash back-off
	h.tick()
	g1 := h.newest()
	if g1 == g0 || g1.epoch != 1 || g1.parent != parentKept {
		t.Fatalf("successor: epoch %d parent %v, want epoch 1 on the kept sockets", g1.epoch, g1.parent)
	}
	h.wantStates("0:wedged 1:starting")
	if slices.Contains(h.table.signals, "SIGKILL 101") {
		t.Fatal("the wedged generation was killed before its successor served")
	}
	h.ready(g1)
	h.wantStates("0:wedged 1:serving")
	if !slices.Contains(h.table.signals, "SIGKILL 101") {
		t.Fatalf("the wedged generation was not killed once its successor served: %v", h.table.signals)
	}
	h.m.onExit(g0, exit{how: "killed by SIGKILL"})
	h.wantStates("1:serving")
	if h.m.op != nil {
		t.Fatal("the wedged generation's death started another generation")
	}
}

// TestMachineStartsColdWithoutKeptSockets: with nothing kept (or
// keep_listeners off), a crash restart is cold, as before.
func TestMachineStartsColdWithoutKeptSockets(t *testing.T) {
	h := newMachineHarness(t, 0)
	g0 := h.newest()
	h.m.onExit(g0, exit{how: "killed by SIGKILL"})
	h.clock.advance(time.Second)
	h.tick()
	if g1 := h.newest(); g1 == g0 || g1.parent != parentNone {
		t.Fatalf("after a crash with nothing kept: parent %v, want none", g1.parent)
	}
}

// TestMachineDropsKeptSocketsAGenerationFailedOn: a generation that fails
// on the kept sockets (an older binary that cannot take them) makes the
// next start cold instead of failing for ever.
func TestMachineDropsKeptSocketsAGenerationFailedOn(t *testing.T) {
	h := newMachineHarness(t, 0)
	kept := true
	h.m.keptSockets = func() bool { return kept }
	h.m.dropKept = func(string) { kept = false }
	g0 := h.newest()
	h.m.onExit(g0, exit{how: "killed by SIGKILL"})
	h.clock.advance(time.Second)
	h.tick()
	g1 := h.newest()
	if g1.parent != parentKept {
		t.Fatalf("parent %v, want kept", g1.parent)
	}
	h.m.onReady(readyMsg{gen: g1, line: "FAILED flag provided but not defined: -restart-parent kept"})
	h.m.onExit(g1, exit{how: "exit status 2"})
	h.clock.advance(10 * time.Second)
	h.tick()
	if g2 := h.newest(); g2 == g1 || g2.parent != parentNone {
		t.Fatalf("after a failure on the kept sockets: parent %v, want none (cold)", g2.parent)
	}
}
