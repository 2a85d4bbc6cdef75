package shm

import (
	"path/filepath"
	"sync/atomic"
	"testing"
)

// retired returns the Retired flag of each stat of r's snapshot by name.
func retired(t *testing.T, r *Region) map[string]bool {
	t.Helper()
	snap, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, st := range snap.Stats {
		m[st.Name] = st.Retired
	}
	return m
}

// TestRetiredStats: a stat is retired once no live generation declares
// it: when the only generation that had it exits, or undeclares it (its
// listener was removed). While any live generation has it, or when no
// generation is live, or a live one keeps no declarations (layout before
// 1.2), nothing is retired. Values are kept either way.
func TestRetiredStats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.stats")
	old, err := Open(Options{Path: path, Epoch: 0})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := old.Alloc("listener.gone.rq", KindCounter, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := old.Lane(gone, 0); err != nil {
		t.Fatal(err)
	} else {
		atomic.AddUint64(p, 7)
	}
	if _, err := old.Alloc("listener.web.rq", KindCounter, 0); err != nil {
		t.Fatal(err)
	}
	cur, err := Open(Options{Path: path, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if _, err := cur.Alloc("listener.web.rq", KindCounter, 0); err != nil {
		t.Fatal(err)
	}
	if m := retired(t, cur); m["listener.gone.rq"] || m["listener.web.rq"] {
		t.Fatalf("retired while both generations live: %v", m)
	}

	old.Close() // epoch 0 exits: folded
	if m := retired(t, cur); !m["listener.gone.rq"] || m["listener.web.rq"] {
		t.Fatalf("after epoch 0 exited: %v, want only listener.gone.rq retired", m)
	}
	snap, _ := cur.Snapshot()
	for _, st := range snap.Stats {
		if st.Name == "listener.gone.rq" && st.Counter != 7 {
			t.Errorf("a retired counter lost its value: %d, want 7", st.Counter)
		}
	}

	// The bit lost (a truncated region written back): Heartbeat sets it
	// again.
	atomic.StoreUint64(cur.word(cur.g.record(1)+rDeclared), 0)
	if m := retired(t, cur); !m["listener.web.rq"] {
		t.Fatal("clearing the word did not retire the stat: the test proves nothing")
	}
	cur.Heartbeat()
	if m := retired(t, cur); m["listener.web.rq"] {
		t.Error("Heartbeat did not declare listener.web.rq again")
	}

	// Undeclared (its listener removed): retired.
	if err := cur.Undeclare("listener.web.rq"); err != nil {
		t.Fatal(err)
	}
	cur.Heartbeat() // must not bring it back
	if m := retired(t, cur); !m["listener.web.rq"] {
		t.Error("an undeclared stat is not retired")
	}

	// A live owner that keeps no declarations (before 1.2): nothing can
	// be called retired.
	ob := cur.g.owner(cur.slot)
	cur.st(ob+oDeclares, 0)
	if m := retired(t, cur); m["listener.web.rq"] || m["listener.gone.rq"] {
		t.Errorf("retired with a live owner of an older layout: %v", m)
	}
	cur.st(ob+oDeclares, 1)

	// Reopened by a new generation in the same slot: it declares nothing
	// it did not allocate.
	cur.Close()
	next, err := Open(Options{Path: path, Epoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if m := retired(t, next); !m["listener.web.rq"] || !m["listener.gone.rq"] {
		t.Errorf("a new generation inherited declarations: %v", m)
	}
	next.Close()
	rd, err := OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	s, err := rd.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range s.Stats {
		if st.Retired {
			t.Errorf("%s retired with no live generation", st.Name)
		}
	}
}
