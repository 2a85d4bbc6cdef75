package ratelog

import (
	"bytes"
	"strconv"
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
	// Every call held back is reported once: the first line may carry
	// calls held back while it was being logged, the next the rest.
	held := 0
	for _, f := range strings.Fields(buf.String()) {
		if v, ok := strings.CutPrefix(f, "suppressed="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			held += n
		}
	}
	if held != 799 {
		t.Fatalf("the lines report %d held back, want 799:\n%s", held, buf.String())
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
