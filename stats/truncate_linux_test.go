package stats

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hotproxy/hotproxy/shm"
)

// syncBuffer is a log sink safe for the store's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// truncateFile truncates path from another process (coreutils truncate),
// as an outsider would, or with os.Truncate if there is no such tool.
func truncateFile(tb testing.TB, path string, size int64) {
	tb.Helper()
	if bin, err := exec.LookPath("truncate"); err == nil {
		if out, err := exec.Command(bin, "-s", strconv.FormatInt(size, 10), path).CombinedOutput(); err != nil {
			tb.Fatalf("truncate: %v: %s", err, out)
		}
		return
	}
	if err := os.Truncate(path, size); err != nil {
		tb.Fatal(err)
	}
}

// TestRegionTruncatedUnderWriters truncates the region file of a live store
// from another process, again and again, while worker lanes add to counters
// and gauges as fast as they can and the main lane sets a gauge right
// after each truncation (the server's gauge refresh, which used to die of
// SIGBUS in GaugeLane.Set). The process must survive, the truncations must
// be counted and logged, and afterwards the values must work exactly and a
// next generation must attach.
func TestRegionTruncatedUnderWriters(t *testing.T) {
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		t.Skip("no /dev/shm (tmpfs) on this machine")
	}
	path := filepath.Join("/dev/shm", "hotproxy-test-"+filepath.Base(t.TempDir())+".stats")
	t.Cleanup(func() { os.Remove(path) })
	const workers = 4
	regionOpts := shm.Options{Path: path, Lanes: workers + 1, MaxOwners: 4, MaxLanes: 8,
		MaxRecords: 256, StringBytes: 1 << 16, ValueBytes: 1 << 20}
	region, err := shm.Open(regionOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { region.Close() })
	var logs syncBuffer
	s, err := New(Options{Region: region, Workers: workers,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})})
	if err != nil {
		t.Fatal(err)
	}
	rq := s.Counter("listener.web.downstream_rq_total")
	active := s.Gauge("listener.web.downstream_rq_active", GaugeSum)
	live := s.Gauge("server.live", GaugeNewest).Lane(0)
	hist := s.Histogram("listener.web.downstream_rq_time")

	var stop chan struct{}
	var wg sync.WaitGroup
	startWriters := func() {
		stop = make(chan struct{})
		for w := 1; w <= workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, g, h := rq.Lane(w), active.Lane(w), hist.Lane(w)
				for {
					select {
					case <-stop:
						return
					default:
					}
					g.Inc()
					c.Inc()
					h.Record(0.001)
					g.Dec()
				}
			}()
		}
	}
	stopWriters := func() {
		close(stop)
		wg.Wait()
	}
	// Under the race detector a fault inside an atomic operation is fatal
	// (see raceEnabled): there the writers run between the truncations,
	// not across them. A normal build (go test ./stats/, and the
	// integration test of a real process) writes across them.
	startWriters()
	const truncations = 8
	fullSize := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	size := fullSize()
	cuts := []int64{0, 4096, size / 2, size - 4096}
	for i := 0; i < truncations; i++ {
		if raceEnabled {
			stopWriters()
		}
		truncateFile(t, path, cuts[i%len(cuts)])
		live.Set(1) // the main goroutine's gauge refresh, right after
		s.Flush()
		deadline := time.Now().Add(5 * time.Second)
		for fullSize() != size {
			if time.Now().After(deadline) {
				t.Fatalf("truncation %d: the file was not restored to %d bytes", i, size)
			}
			time.Sleep(time.Millisecond)
		}
		if raceEnabled {
			startWriters()
		}
	}
	stopWriters()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	if n := region.Truncations(); n < truncations {
		t.Errorf("region counted %d truncations, want at least %d", n, truncations)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// The counter's own lane may have been in a later cut, so it holds at
	// least the last one.
	if v := find(t, snap, RegionTruncatedCounter).Counter; v < 1 {
		t.Errorf("%s = %d, want >= 1", RegionTruncatedCounter, v)
	}
	if !strings.Contains(logs.String(), "stats region file was truncated") {
		t.Errorf("no loud log line about the truncation:\n%s", logs.String())
	}
	t.Logf("truncations %d, lost lane writes %d", region.Truncations(), find(t, snap, RegionLostWritesCounter).Counter)

	// Values work exactly again.
	before := find(t, snap, rq.Name()).Counter
	for w := 1; w <= workers; w++ {
		rq.Lane(w).Add(1000)
	}
	live.Set(1)
	if snap, err = s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if got := find(t, snap, rq.Name()).Counter; got != before+workers*1000 {
		t.Errorf("counter after the truncations: %d, want %d", got, before+workers*1000)
	}
	if got := find(t, snap, "server.live").Gauge; got != 1 {
		t.Errorf("server.live = %d, want 1", got)
	}
	// A next generation attaches to the restored region and counts on.
	next := regionOpts
	next.Epoch = 1
	r2, err := shm.Open(next)
	if err != nil {
		t.Fatalf("next generation: %v", err)
	}
	defer r2.Close()
	s2, err := New(Options{Region: r2, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	s2.Counter(rq.Name()).Lane(1).Add(5)
	if snap, err = s2.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if got := find(t, snap, rq.Name()).Counter; got != before+workers*1000+5 {
		t.Errorf("counter over two generations: %d, want %d", got, before+workers*1000+5)
	}
}
