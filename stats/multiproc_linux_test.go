package stats

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

// The multi-process test re-executes the test binary as a child generation
// (tableflip style): TestMain runs childMain when childEnv is set.
const childEnv = "HOTPROXY_STATS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := childMain(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	mpWorkers = 3
	mpPerLane = 200000
)

// childMain is one generation: it attaches to the region, says "ready",
// waits for "go", counts mpPerLane on each worker lane concurrently,
// flushes, says "done", then waits for "exit" (or EOF) to close cleanly.
// It may be SIGKILLed while it waits.
func childMain() error {
	epoch, _ := strconv.ParseUint(os.Getenv("EPOCH"), 10, 64)
	region, err := shm.Open(shm.Options{Path: os.Getenv(childEnv), Epoch: epoch, Lanes: mpWorkers + 1,
		MaxOwners: 4, MaxLanes: 8, MaxRecords: 64, StringBytes: 4096, ValueBytes: 1 << 16})
	if err != nil {
		return err
	}
	s, err := New(Options{Region: region, Workers: mpWorkers})
	if err != nil {
		return err
	}
	req := s.Counter("test.requests")
	inflight := s.Gauge("test.inflight", GaugeSum)
	live := s.Gauge("server.live", GaugeNewest)
	lat := s.Histogram("test.latency")
	live.Lane(0).Set(1)
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		return fmt.Errorf("expected go, got %q", in.Text())
	}
	var wg sync.WaitGroup
	for w := 1; w <= mpWorkers; w++ {
		wg.Add(1)
		go func(c CounterLane, g GaugeLane, h *HistogramLane) {
			defer wg.Done()
			g.Inc()
			for i := 0; i < mpPerLane; i++ {
				c.Inc()
				if i%100 == 0 {
					h.Record(0.01)
				}
			}
		}(req.Lane(w), inflight.Lane(w), lat.Lane(w))
	}
	wg.Wait()
	if err := s.Flush(); err != nil {
		return err
	}
	fmt.Println("done")
	in.Scan() // "exit" or EOF
	return errorsJoin(s.Close(), region.Close())
}

func errorsJoin(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startChild(tb testing.TB, path string, epoch int) *child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path, "EPOCH="+strconv.Itoa(epoch))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
}

func (c *child) expect(tb testing.TB, want string) {
	tb.Helper()
	done := make(chan bool, 1)
	go func() { done <- c.out.Scan() && c.out.Text() == want }()
	select {
	case ok := <-done:
		if !ok {
			tb.Fatalf("child %d: expected %q, got %q", c.cmd.Process.Pid, want, c.out.Text())
		}
	case <-time.After(60 * time.Second):
		tb.Fatalf("child %d: timeout waiting for %q", c.cmd.Process.Pid, want)
	}
}

func (c *child) send(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		tb.Fatal(err)
	}
}

type mpWant struct {
	requests, latencyCount uint64
	inflight, live         int64
	owners                 []int // pids
}

func checkRegion(tb testing.TB, rd *shm.Reader, w mpWant) {
	tb.Helper()
	snap, err := rd.Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	got := mpWant{
		requests:     find(tb, snap, "test.requests").Counter,
		latencyCount: find(tb, snap, "test.latency").Histogram.Count,
		inflight:     find(tb, snap, "test.inflight").Gauge,
		live:         find(tb, snap, "server.live").Gauge,
	}
	for _, o := range snap.Owners {
		got.owners = append(got.owners, o.PID)
	}
	sort.Ints(got.owners)
	sort.Ints(w.owners)
	if fmt.Sprint(got) != fmt.Sprint(w) {
		tb.Fatalf("region:\n got %+v\nwant %+v", got, w)
	}
}

// TestMultiProcess: two generations count concurrently on one region; one
// is SIGKILLed after counting a known amount; a third attaches and folds
// it; the totals are exact (nothing lost, nothing counted twice), the dead
// one's gauges drop out, and clean exits fold too.
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	path := filepath.Join(t.TempDir(), "hotproxy.test.stats")
	const per = mpWorkers * mpPerLane
	const lat = mpWorkers * mpPerLane / 100

	a, b := startChild(t, path, 0), startChild(t, path, 1)
	a.expect(t, "ready")
	b.expect(t, "ready")
	a.send(t, "go")
	b.send(t, "go")
	a.expect(t, "done")
	b.expect(t, "done")

	rd, err := shm.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	pa, pb := a.cmd.Process.Pid, b.cmd.Process.Pid
	checkRegion(t, rd, mpWant{2 * per, 2 * lat, 2 * mpWorkers, 1, []int{pa, pb}})

	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.cmd.Wait()

	c := startChild(t, path, 2) // notices b's death and folds it on Open
	c.expect(t, "ready")
	pc := c.cmd.Process.Pid
	checkRegion(t, rd, mpWant{2 * per, 2 * lat, mpWorkers, 1, []int{pa, pc}})
	c.send(t, "go")
	c.expect(t, "done")
	checkRegion(t, rd, mpWant{3 * per, 3 * lat, 2 * mpWorkers, 1, []int{pa, pc}})

	a.send(t, "exit")
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("a: %v", err)
	}
	checkRegion(t, rd, mpWant{3 * per, 3 * lat, mpWorkers, 1, []int{pc}})
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("c: %v", err)
	}
	checkRegion(t, rd, mpWant{3 * per, 3 * lat, 0, 0, nil})
}
