package accesslog

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/internal/safefile/safefiletest"
)

// TestWriteFailuresAreCountedAndRateLimited (issue 20, item 10): on a full
// tmpfs every write fails with ENOSPC; each lost line is counted (Lost,
// and LinesLost, which feeds access_log.dropped), and the process log
// gets one warning, not one per write.
func TestWriteFailuresAreCountedAndRateLimited(t *testing.T) {
	dir := safefiletest.FullTmpfs(t, 64<<10, "access.log")
	var out syncBuffer
	var reported atomic.Uint64
	l, err := New(Options{
		Path: filepath.Join(dir, "access.log"), Format: "%PATH%",
		Logger:    hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Warn}),
		LinesLost: func(n uint64) { reported.Add(n) },
	})
	if err != nil {
		t.Fatal(err)
	}
	const batches, perBatch = 5, 20
	for b := range batches {
		for i := range perBatch {
			if !l.Enqueue(record(b*perBatch + i)) {
				t.Fatal("queue full")
			}
		}
		// Each batch is its own write: wait until the writer lost it.
		want := uint64((b + 1) * perBatch)
		deadline := time.Now().Add(10 * time.Second)
		for l.Lost() < want {
			if time.Now().After(deadline) {
				t.Fatalf("batch %d: %d lines lost after 10s, want %d", b, l.Lost(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	l.Close()
	if got := l.Lost(); got != batches*perBatch {
		t.Errorf("Lost() = %d, want %d", got, batches*perBatch)
	}
	if got := reported.Load(); got != batches*perBatch {
		t.Errorf("LinesLost reported %d lines, want %d", got, batches*perBatch)
	}
	logged := out.String()
	if n := strings.Count(logged, "write failed"); n != 1 || !strings.Contains(logged, "no space left on device") {
		t.Errorf("%d warnings for %d failed writes, want 1 naming ENOSPC:\n%s", n, batches, logged)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPartialWriteCountsOnlyLostLines: with a little room left, the
// kernel takes part of a write; the lines it took are in the file, the
// rest (the one cut short among them) are counted lost: together, every
// line, once.
func TestPartialWriteCountsOnlyLostLines(t *testing.T) {
	dir := safefiletest.FullTmpfs(t, 64<<10, "access.log")
	filler := filepath.Join(dir, "filler")
	fi, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, fi.Size()-8192); err != nil { // two pages free
		t.Fatal(err)
	}
	path := filepath.Join(dir, "access.log")
	l, err := New(Options{Path: path, Format: "json", QueueSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200 // about 50 KB of JSON lines: far more than fits
	for i := range n {
		if !l.Enqueue(record(i)) {
			t.Fatal("queue full")
		}
	}
	l.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	whole := strings.Count(string(b), "\n")
	if whole == 0 || l.Lost() == 0 {
		t.Fatalf("%d lines written, %d lost: want some of each (the write was not partial)", whole, l.Lost())
	}
	if got := uint64(whole) + l.Lost(); got != n {
		t.Errorf("%d lines written + %d lost = %d, want %d", whole, l.Lost(), got, n)
	}
}
