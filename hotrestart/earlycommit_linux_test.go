package hotrestart

import (
	"slices"
	"testing"
	"time"
)

// committer is a recorder that also commits early.
type committer struct {
	*recorder
	commits chan Identity
}

func (c committer) Commit(child Identity) { c.commits <- child }

var _ EarlyCommitter = committer{}

// TestEarlyCommitReachesTheParent: a child that hands over in turn tells
// its parent to commit; the parent's handler hears it once, and the
// connection stays up (the parent's commit is what closes it).
func TestEarlyCommitReachesTheParent(t *testing.T) {
	h := committer{recorder: newRecorder(t, 1), commits: make(chan Identity, 4)}
	p := startParent(t, h, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if !slices.Contains(ch.Parent().Features, FeatureEarlyCommit) {
		t.Fatalf("parent features %v lack %q", ch.Parent().Features, FeatureEarlyCommit)
	}
	_, files, err := ch.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(files)
	if err := ch.Drain(nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	select {
	case got := <-h.commits:
		if got.Epoch != 1 {
			t.Errorf("commit from epoch %d, want 1", got.Epoch)
		}
	case ev := <-h.lost:
		t.Fatalf("the parent lost the child instead of committing: %+v", ev)
	case <-time.After(5 * time.Second):
		t.Fatal("the parent's handler never heard the commit")
	}
	select {
	case ev := <-h.lost:
		t.Fatalf("the commit ended the session: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestEarlyCommitNotSentToAParentWithoutIt: a parent whose handler cannot
// commit early does not offer the feature, and a child does not send it
// the message (which such a parent would take for a broken child, and
// roll back).
func TestEarlyCommitNotSentToAParentWithoutIt(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if slices.Contains(ch.Parent().Features, FeatureEarlyCommit) {
		t.Fatalf("a parent without EarlyCommitter offers %q", FeatureEarlyCommit)
	}
	_, files, err := ch.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(files)
	if err := ch.Drain(nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	select {
	case ev := <-r.lost:
		t.Fatalf("the parent lost the child: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestCommitBeforeDrainIsRefused: only a child that serves (has asked for
// the drain) may commit its parent.
func TestCommitBeforeDrainIsRefused(t *testing.T) {
	h := committer{recorder: newRecorder(t, 1), commits: make(chan Identity, 4)}
	p := startParent(t, h, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	select {
	case ev := <-h.lost:
		if ev.drained || ev.err == nil {
			t.Fatalf("lost event %+v, want an error before any drain", ev)
		}
	case <-h.commits:
		t.Fatal("a commit before the drain was accepted")
	case <-time.After(5 * time.Second):
		t.Fatal("the parent neither refused nor accepted a commit before the drain")
	}
}
