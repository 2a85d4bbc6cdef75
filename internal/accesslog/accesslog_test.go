package accesslog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

func record(i int) *Record {
	r := &Record{Start: time.Unix(1700000000, int64(i)*int64(time.Millisecond)), Status: 200, Minor: 1, BytesSent: int64(i), Cluster: "backend", Upstream: "127.0.0.1:9000"}
	r.SetMethod([]byte("GET"))
	r.SetPath(fmt.Appendf(nil, "/r/%d", i))
	r.SetClientIP([]byte("127.0.0.1"))
	return r
}

func readLines(tb testing.TB, path string) []string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestVariablesKnown(t *testing.T) {
	for _, name := range config.AccessLogVariables {
		if variables[name] == varNone {
			t.Errorf("config.AccessLogVariables has %s, which the writer does not know", name)
		}
	}
	if len(variables) != len(config.AccessLogVariables) {
		t.Errorf("%d variables here, %d in config", len(variables), len(config.AccessLogVariables))
	}
}

// TestLinesMatchRecords: many producers at once; every record becomes
// exactly one whole line, as JSON and as text.
func TestLinesMatchRecords(t *testing.T) {
	for _, format := range []string{"json", `%METHOD% %PATH% %RESPONSE_CODE% "%UPSTREAM_HOST%" %START_TIME%`} {
		t.Run(format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			l, err := New(Options{Path: path, Format: format, QueueSize: 1 << 16, Listener: "web"})
			if err != nil {
				t.Fatal(err)
			}
			const producers, each = 8, 2000
			var wg sync.WaitGroup
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						if !l.Enqueue(record(p*each + i)) {
							t.Errorf("record dropped with a queue larger than all of them")
							return
						}
					}
				}()
			}
			wg.Wait()
			l.Close()
			lines := readLines(t, path)
			if len(lines) != producers*each {
				t.Fatalf("%d lines for %d records", len(lines), producers*each)
			}
			seen := map[string]bool{}
			for _, line := range lines {
				var p string
				if format == "json" {
					var m map[string]any
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Fatalf("line %q: %v", line, err)
					}
					p = m["PATH"].(string)
					if m["LISTENER"] != "web" || m["RESPONSE_CODE"] != float64(200) {
						t.Fatalf("line %q", line)
					}
				} else {
					f := strings.Fields(line)
					if len(f) != 5 || f[0] != "GET" || f[2] != "200" || f[3] != `"127.0.0.1:9000"` {
						t.Fatalf("line %q", line)
					}
					p = f[1]
				}
				if seen[p] {
					t.Fatalf("%s logged twice", p)
				}
				seen[p] = true
			}
		})
	}
}

// TestFullQueueNeverBlocks: the file is a FIFO nobody reads, so the
// writer is stuck in write(2); Enqueue must still return at once, and
// count what it drops.
func TestFullQueueNeverBlocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// A reader that never reads: the writer's open succeeds, its
	// writes block once the pipe's buffer is full.
	rd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Options{Path: path, Format: "json", QueueSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dropped := 0
	const n = 20000
	for i := range n {
		if !l.Enqueue(record(i)) {
			dropped++
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("%d enqueues took %v", n, d)
	}
	if dropped == 0 {
		t.Fatal("nothing dropped: the writer was not blocked, the test proves nothing")
	}
	t.Logf("%d of %d dropped in %v", dropped, n, time.Since(start))
	rd.Close() // the writer's write fails (EPIPE) and it can finish
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs after the reader went away")
	}
}

// TestReopen: after the file is moved away (logrotate), Reopen makes new
// lines go to a new file at the path, and none is lost.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := New(Options{Path: path, Format: "%PATH%"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 10 {
		l.Enqueue(record(i))
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := <-l.Reopen(); err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 15; i++ {
		l.Enqueue(record(i))
	}
	l.Close()
	old, cur := readLines(t, path+".1"), readLines(t, path)
	if len(old) != 10 || len(cur) != 5 || old[9] != "/r/9" || cur[0] != "/r/10" {
		t.Fatalf("rotated %q, new %q", old, cur)
	}
}

func TestNewNamesTheFile(t *testing.T) {
	_, err := New(Options{Path: "/nonexistent-dir/a.log"})
	if err == nil || !strings.Contains(err.Error(), `"/nonexistent-dir/a.log"`) || !strings.Contains(err.Error(), "create its directory") {
		t.Fatalf("error %v", err)
	}
}

func TestEnqueueAllocatesNothing(t *testing.T) {
	l, err := New(Options{Path: filepath.Join(t.TempDir(), "a.log"), QueueSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := record(1)
	if a := testing.AllocsPerRun(1000, func() { l.Enqueue(r) }); a != 0 {
		t.Errorf("Enqueue allocates %v per record", a)
	}
}

func TestTextEscapes(t *testing.T) {
	fm, err := compile("%PATH% %UPSTREAM_HOST%", "web", 0)
	if err != nil {
		t.Fatal(err)
	}
	r := record(0)
	r.SetPath([]byte("/a\"b\n"))
	r.Upstream = ""
	if got := string(fm.append(nil, r)); got != `/a\x22b\x0a -`+"\n" {
		t.Fatalf("got %q", got)
	}
}

// TestDurationHasMicroseconds: %DURATION% is milliseconds to the
// microsecond (a local answer takes 0.042 ms; whole milliseconds logged 0),
// in text and as a JSON number.
func TestDurationHasMicroseconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{42 * time.Microsecond, "0.042"}, {1500 * time.Microsecond, "1.500"}, {2 * time.Second, "2000.000"}, {0, "0.000"}} {
		f, err := compile("%DURATION%", "web", 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(f.append(nil, &Record{Duration: c.d})); got != c.want+"\n" {
			t.Errorf("%%DURATION%% of %v = %q, want %q", c.d, got, c.want)
		}
	}
}
