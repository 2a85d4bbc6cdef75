package ratelog

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestLimiterHoldsBackAndCounts(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	log := hclog.New(&hclog.LoggerOptions{Output: &lockedWriter{w: &buf, mu: &mu}, Level: hclog.Warn})
	l := &Limiter{Log: log, Every: time.Hour}

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				l.Warn("peer refused", "uid", 65534)
			}
		}()
	}
	wg.Wait()
	if got := l.Total(); got != 800 {
		t.Fatalf("Total = %d, want 800", got)
	}
	mu.Lock()
	lines := strings.Count(buf.String(), "peer refused")
	mu.Unlock()
	if lines != 1 {
		t.Fatalf("%d lines logged in one interval, want 1:\n%s", lines, buf.String())
	}

	// The next interval's line says how many were held back.
	l.next.Store(0)
	if !l.Warn("peer refused") {
		t.Fatal("a warning in a new interval was held back")
	}
	if !strings.Contains(buf.String(), "suppressed=799") {
		t.Fatalf("the line after an interval does not carry the held-back count:\n%s", buf.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
