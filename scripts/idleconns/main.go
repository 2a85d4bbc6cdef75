// Command idleconns measures what an idle keep-alive connection costs a
// proxy in memory, for scripts/bench-peers.sh: it reads the resident
// memory of the proxy's processes, opens many connections through the
// proxy that each make one request, read the whole response and then stay
// idle, reads the memory again, and prints the difference per connection.
//
// Memory is the sum over the given pids of Pss from
// /proc/<pid>/smaps_rollup (shared pages split among the processes that
// map them, so nginx's master and worker are not counted twice) and, for
// reference, of VmRSS from /proc/<pid>/status. Linux only.
//
// With -burst the connections arrive as a burst instead (issue 22): all
// of them are opened first, then each sends its request at the same
// moment, and no response is read before every request has been sent, so
// that the proxy has them all in hand at once; then the responses are
// read and the connections stay idle. What is left resident -settle later
// is what the burst did not give back.
//
// The result is one line of key=value pairs on stdout. It exits non-zero,
// saying why, when the figure would be wrong: a connection that could not
// be opened, a request that did not get a 200, or a connection the proxy
// closed before the second reading (an idle connection the proxy has
// already dropped costs it nothing, and would flatter it).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "", "proxy `host:port` to connect to (HTTP)")
	conns := flag.Int("conns", 4000, "idle keep-alive `connections` to open")
	parallel := flag.Int("parallel", 64, "connections being opened at once")
	pidList := flag.String("pids", "", "the proxy's `pids`, comma or space separated: every process of its tree")
	settle := flag.Duration("settle", time.Second, "wait this long with every connection idle before the second reading")
	burst := flag.Bool("burst", false, "open every connection first, then send all requests at once, reading no response until all are sent")
	timeout := flag.Duration("timeout", 10*time.Second, "bound on connecting and on each request")
	flag.Parse()
	pids, err := parsePids(*pidList)
	if err == nil && *addr == "" {
		err = errors.New("-addr is required")
	}
	if err == nil && (*conns < 1 || *parallel < 1) {
		err = errors.New("-conns and -parallel must be at least 1")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "idleconns: %v\n", err)
		os.Exit(2)
	}
	run := runIdle
	if *burst {
		run = runBurst
	}
	if err := run(*addr, *conns, *parallel, pids, *settle, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "idleconns: %v\n", err)
		os.Exit(1)
	}
}

func runIdle(addr string, conns, parallel int, pids []int, settle, timeout time.Duration) error {
	before, err := readMemory(pids)
	if err != nil {
		return err
	}
	var (
		closedByPeer atomic.Int64
		mu           sync.Mutex // guards open and firstErr
		open         []net.Conn
		firstErr     error
		failed       int
	)
	todo := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, conns) {
		wg.Go(func() {
			for range todo {
				c, err := openIdle(addr, timeout)
				mu.Lock()
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
				} else {
					open = append(open, c)
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				// An idle client sends nothing more; the read returns only
				// when the proxy closes the connection (or sends junk).
				go func() {
					var b [1]byte
					c.Read(b[:])
					closedByPeer.Add(1)
				}()
			}
		})
	}
	for i := range conns {
		todo <- i
	}
	close(todo)
	wg.Wait()
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	if failed > 0 {
		hint := ""
		if errors.Is(firstErr, syscall.EMFILE) {
			hint = " (raise ulimit -n)"
		}
		return fmt.Errorf("%d of %d connections to %s failed; the first: %w%s", failed, conns, addr, firstErr, hint)
	}

	time.Sleep(settle)
	after, err := readMemory(pids)
	if err != nil {
		return err
	}
	if n := closedByPeer.Load(); n > 0 {
		return fmt.Errorf("the proxy at %s closed %d of %d idle connections before the memory was read (is its keep-alive idle timeout shorter than the test?)", addr, n, conns)
	}
	fmt.Printf("conns=%d pss_before_kb=%d pss_after_kb=%d rss_before_kb=%d rss_after_kb=%d pss_kb_per_conn=%.2f rss_kb_per_conn=%.2f\n",
		conns, before.pssKB, after.pssKB, before.rssKB, after.rssKB,
		float64(after.pssKB-before.pssKB)/float64(conns),
		float64(after.rssKB-before.rssKB)/float64(conns))
	return nil
}

// runBurst is -burst: connect all, send all, then read all.
func runBurst(addr string, conns, parallel int, pids []int, settle, timeout time.Duration) error {
	before, err := readMemory(pids)
	if err != nil {
		return err
	}
	open := make([]net.Conn, conns)
	defer func() {
		for _, c := range open {
			if c != nil {
				c.Close()
			}
		}
	}()
	// forEach runs f for every connection index, parallel at once, and
	// returns the first error and how many failed.
	forEach := func(f func(i int) error) (int, error) {
		var (
			mu       sync.Mutex // guards firstErr and failed
			firstErr error
			failed   int
			wg       sync.WaitGroup
		)
		todo := make(chan int)
		for range min(parallel, conns) {
			wg.Go(func() {
				for i := range todo {
					if err := f(i); err != nil {
						mu.Lock()
						failed++
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
					}
				}
			})
		}
		for i := range conns {
			todo <- i
		}
		close(todo)
		wg.Wait()
		return failed, firstErr
	}
	// The connections are open before any request leaves.
	if failed, err := forEach(func(i int) error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		open[i] = c
		return err
	}); failed > 0 {
		hint := ""
		if errors.Is(err, syscall.EMFILE) {
			hint = " (raise ulimit -n)"
		}
		return fmt.Errorf("%d of %d connections to %s failed; the first: %w%s", failed, conns, addr, err, hint)
	}
	// Every request is sent before any response is read: one goroutine
	// per connection, released together.
	req := []byte("GET / HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: idleconns\r\n\r\n")
	var (
		sent    sync.WaitGroup
		release = make(chan struct{})
		sendErr = make([]error, conns)
	)
	for i, c := range open {
		sent.Go(func() {
			<-release
			c.SetWriteDeadline(time.Now().Add(timeout))
			_, sendErr[i] = c.Write(req)
		})
	}
	close(release)
	sent.Wait()
	if err := errors.Join(sendErr...); err != nil {
		return fmt.Errorf("sending the burst's requests to %s: %w", addr, err)
	}
	if failed, err := forEach(func(i int) error { return readIdleResponse(open[i], timeout) }); failed > 0 {
		return fmt.Errorf("%d of %d responses through %s failed; the first: %w", failed, conns, addr, err)
	}
	var closedByPeer atomic.Int64
	for _, c := range open {
		go func() {
			var b [1]byte
			c.Read(b[:])
			closedByPeer.Add(1)
		}()
	}
	time.Sleep(settle)
	after, err := readMemory(pids)
	if err != nil {
		return err
	}
	if n := closedByPeer.Load(); n > 0 {
		return fmt.Errorf("the proxy at %s closed %d of %d idle connections before the memory was read (is its keep-alive idle timeout shorter than the test?)", addr, n, conns)
	}
	printMemory(conns, before, after)
	return nil
}

func printMemory(conns int, before, after memory) {
	fmt.Printf("conns=%d pss_before_kb=%d pss_after_kb=%d rss_before_kb=%d rss_after_kb=%d pss_kb_per_conn=%.2f rss_kb_per_conn=%.2f\n",
		conns, before.pssKB, after.pssKB, before.rssKB, after.rssKB,
		float64(after.pssKB-before.pssKB)/float64(conns),
		float64(after.rssKB-before.rssKB)/float64(conns))
}

// openIdle connects, makes one keep-alive request and reads its whole
// response, so that the connection is idle in the proxy's keep-alive wait.
func openIdle(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+addr+"\r\nUser-Agent: idleconns\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	if err := readIdleResponse(c, timeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// readIdleResponse reads one whole 200 response from c that leaves it
// keep-alive and with nothing more buffered; the deadline is then cleared.
func readIdleResponse(c net.Conn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("reading the response: %w", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		err = fmt.Errorf("reading the response body: %w", err)
	case resp.StatusCode != http.StatusOK:
		err = fmt.Errorf("got %s, want 200 OK (is the backend up?)", resp.Status)
	case resp.Close:
		err = errors.New("the proxy answered Connection: close to a keep-alive request")
	case br.Buffered() > 0:
		err = fmt.Errorf("%d bytes after the response", br.Buffered())
	}
	if err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	return nil
}

type memory struct{ pssKB, rssKB int64 }

// readMemory sums Pss and VmRSS over pids.
func readMemory(pids []int) (memory, error) {
	var total memory
	for _, pid := range pids {
		pss, err := procField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:")
		if err != nil {
			return memory{}, err
		}
		rss, err := procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
		if err != nil {
			return memory{}, err
		}
		total.pssKB += pss
		total.rssKB += rss
	}
	return total, nil
}

// procField returns the kB figure of the line starting with key in a
// /proc file laid out like "Key:   1234 kB".
func procField(path, key string) (int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("reading the proxy's memory: %w (has it exited?)", err)
	}
	if err != nil {
		return 0, fmt.Errorf("reading the proxy's memory: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(line, key)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			break
		}
		return strconv.ParseInt(fields[0], 10, 64)
	}
	return 0, fmt.Errorf("%s: no %q line", path, key)
}

func parsePids(list string) ([]int, error) {
	var pids []int
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("-pids: %q is not a process id", f)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, errors.New("-pids: give the proxy's process ids")
	}
	return pids, nil
}
