// Package accesslog writes a listener's access log: one line per request,
// formatted and written by a goroutine of the log's own, fed by a bounded
// lock-free queue of fixed-size records. A request never waits for the
// log: when the queue is full its record is dropped, and the caller counts
// it.
//
// Lines of two generations (a hot restart) go to the same file without
// loss, duplication or interleaving: each generation logs only the
// requests it served, the file is opened with O_APPEND (the kernel moves
// to the end and writes as one step), and the writer hands the kernel
// whole lines only, in one write(2) of at most a buffer: Linux holds the
// inode's lock for a whole write to a regular file, so another process's
// lines land before or after it, never inside. A generation that exits
// writes out its queue first (Close).
package accesslog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/internal/safefile"
)

// Sizes of a record's copied fields; longer values are cut.
const (
	MaxMethod = 16
	MaxPath   = 512
	maxIP     = 46 // the longest IPv6 address in text, plus one
)

// Record is one request, filled by the data path and copied into the
// queue: fixed size, so enqueueing allocates nothing. Cluster and
// Upstream are strings the proxy keeps anyway (the route's cluster name,
// the endpoint's address), shared, not copied.
type Record struct {
	Start         time.Time
	Duration      time.Duration
	BytesReceived int64 // the request body's Content-Length; -1 chunked
	BytesSent     int64
	Status        uint16 // 0: no response was sent
	Minor         uint8  // HTTP/1.<Minor>
	HTTP2         bool   // HTTP/2.0 (Minor does not apply)
	Retries       uint8
	methodLen     uint8
	ipLen         uint8
	pathLen       uint16
	method        [MaxMethod]byte
	clientIP      [maxIP]byte
	path          [MaxPath]byte
	Cluster       string
	Upstream      string
}

// SetMethod, SetPath and SetClientIP copy (and cut) the request's values.
func (r *Record) SetMethod(b []byte) { r.methodLen = uint8(copy(r.method[:], b)) }

func (r *Record) SetPath(b []byte) { r.pathLen = uint16(copy(r.path[:], b)) }

func (r *Record) SetClientIP(b []byte) { r.ipLen = uint8(copy(r.clientIP[:], b)) }

func (r *Record) Method() []byte   { return r.method[:r.methodLen] }
func (r *Record) Path() []byte     { return r.path[:r.pathLen] }
func (r *Record) ClientIP() []byte { return r.clientIP[:r.ipLen] }

// Options configure a Logger; the zero value of each optional field is
// the default.
type Options struct {
	Path   string // the file; required
	Format string // "json" or a format string; "": config.DefaultAccessLogFormat
	// QueueSize is rounded up to a power of two; 0:
	// config.DefaultAccessLogQueue.
	QueueSize int
	Listener  string       // %LISTENER%
	Epoch     int          // %EPOCH%
	Logger    hclog.Logger // write and reopen errors; nil: none
	// FileMode of a created file; 0: 0640.
	FileMode os.FileMode
	// LinesLost, if set, is called by the writer goroutine with the number
	// of lines a failed write lost (a full disk: ENOSPC), so that they
	// are counted with the lines a full queue dropped (the listener's
	// access_log.dropped). It must not block.
	LinesLost func(lines uint64)
}

// Logger is one access-log file and its writer goroutine.
type Logger struct {
	opts   Options
	log    hclog.Logger
	format *format
	q      queue

	// sleeping: the writer found the queue empty and waits on wake;
	// the first Enqueue to see it pokes wake.
	sleeping atomic.Bool
	wake     chan struct{}
	reopen   chan chan error
	quit     chan struct{}
	done     chan struct{}
	closed   atomic.Bool
	stopOnce sync.Once

	// The writer's alone after New: the file, and the lines formatted
	// and not yet written.
	f   *os.File
	buf []byte

	// writeFailures logs failed writes at most once per interval: a full
	// disk fails every write, and each would be a line in the process log
	// (on the same full disk, often). lost counts the lines they lost.
	writeFailures ratelog.Limiter
	lost          atomic.Uint64
}

// New opens the file (O_APPEND, created if missing) and starts the
// writer. An error names the file and what to do.
func New(opts Options) (*Logger, error) {
	if opts.Format == "" {
		opts.Format = config.DefaultAccessLogFormat
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = config.DefaultAccessLogQueue
	}
	if opts.FileMode == 0 {
		opts.FileMode = 0o640
	}
	fm, err := compile(opts.Format, opts.Listener, opts.Epoch)
	if err != nil {
		return nil, fmt.Errorf("access log %q: format: %w", opts.Path, err)
	}
	f, err := openFile(opts.Path, opts.FileMode)
	if err != nil {
		return nil, err
	}
	l := &Logger{
		opts:   opts,
		log:    opts.Logger,
		format: fm,
		wake:   make(chan struct{}, 1),
		reopen: make(chan chan error, 1),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
		f:      f,
	}
	if l.log == nil {
		l.log = hclog.NewNullLogger()
	}
	l.writeFailures.Log = l.log
	l.q.init(opts.QueueSize)
	go l.run()
	return l, nil
}

// openFile opens the log for appending. Access logs often live in /tmp
// (the example config's does): a symbolic link, a second hard link or a
// file of another user at the path is refused (internal/safefile), never
// appended to.
func openFile(path string, mode os.FileMode) (*os.File, error) {
	f, err := safefile.OpenAppend(path, mode)
	if errors.Is(err, safefile.ErrUnsafe) {
		return nil, fmt.Errorf("access log %q: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("access log %q: %w (create its directory, or give the process write access to it)", path, err)
	}
	return f, nil
}

// Enqueue hands r to the writer, copying it. It never blocks: it reports
// false when the queue is full (or the log closed) and r was dropped.
func (l *Logger) Enqueue(r *Record) bool {
	if l.closed.Load() || !l.q.push(r) {
		return false
	}
	if l.sleeping.Load() && l.sleeping.CompareAndSwap(true, false) {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// Reopen asks the writer to write out what it has, then open the file's
// path again (logrotate moved the file away). It never waits for the
// writer, which may be stuck on a slow disk: the returned channel
// receives the outcome (ErrClosed for a closed log). On failure the old
// file stays in use, and the writer logs why. Lines enqueued before the
// writer gets to it still go to the old file, as logrotate expects
// (delaycompress).
func (l *Logger) Reopen() <-chan error {
	reply := make(chan error, 1)
	select {
	case l.reopen <- reply:
	case <-l.done:
		reply <- ErrClosed
	default:
		// A reopen is pending: it will open the path after this
		// request too.
		reply <- nil
	}
	return reply
}

// ErrClosed: Reopen on a closed Logger.
var ErrClosed = errors.New("access log closed")

// Close writes out every record queued so far and closes the file.
// Records enqueued afterwards are dropped (one racing with Close may be
// lost: Close comes after the last connection). Safe to call more than
// once.
func (l *Logger) Close() error {
	l.stopOnce.Do(func() {
		l.closed.Store(true)
		close(l.quit)
	})
	<-l.done
	return nil
}

// Path is the file the log writes to.
func (l *Logger) Path() string { return l.opts.Path }

// flushAt: the writer hands a buffer to the kernel once it holds this
// much; whole lines only, one write(2) each.
const flushAt = 32 << 10

func (l *Logger) run() {
	defer close(l.done)
	l.buf = make([]byte, 0, flushAt+4096)
	var rec Record
	for {
		for l.q.pop(&rec) {
			l.add(&rec)
			if len(l.buf) >= flushAt {
				l.write()
			}
		}
		if len(l.buf) > 0 {
			l.write()
		}
		// Sleep, unless a record came in since the queue looked empty
		// (Enqueue publishes its record before it reads sleeping).
		l.sleeping.Store(true)
		if !l.q.empty() {
			l.sleeping.Store(false)
			continue
		}
		select {
		case <-l.wake:
		case reply := <-l.reopen:
			l.sleeping.Store(false)
			for l.q.pop(&rec) {
				l.add(&rec)
			}
			l.write()
			reply <- l.reopenFile()
		case <-l.quit:
			l.sleeping.Store(false)
			for l.q.pop(&rec) {
				l.add(&rec)
				if len(l.buf) >= flushAt {
					l.write()
				}
			}
			l.write()
			if err := l.f.Close(); err != nil {
				l.log.Error("access log: close", "path", l.opts.Path, "error", err)
			}
			return
		}
	}
}

// add formats rec onto the writer's buffer, as one line.
func (l *Logger) add(rec *Record) { l.buf = l.format.append(l.buf, rec) }

// write hands the buffer (whole lines) to the kernel in one write(2) and
// empties it. A failed write loses the lines the kernel did not take,
// never retried: a partly written line followed by the retried whole
// would garble the file. Those lines (the one cut short among them: its
// newline was not written) are counted through LinesLost, and the failure
// is logged at most once per interval.
func (l *Logger) write() {
	if len(l.buf) == 0 {
		return
	}
	if n, err := l.f.Write(l.buf); err != nil {
		lost := uint64(bytes.Count(l.buf[n:], newline))
		l.lost.Add(lost)
		if l.opts.LinesLost != nil {
			l.opts.LinesLost(lost)
		}
		l.writeFailures.Warn("access log: write failed; lines lost (counted in access_log.dropped)", "path", l.opts.Path,
			"lines", lost, "lost_total", l.lost.Load(), "error", err)
	}
	l.buf = l.buf[:0]
}

var newline = []byte{'\n'}

// Lost is the number of lines lost to failed writes.
func (l *Logger) Lost() uint64 { return l.lost.Load() }

func (l *Logger) reopenFile() error {
	f, err := openFile(l.opts.Path, l.opts.FileMode)
	if err != nil {
		l.log.Error("access log: reopen failed; still writing to the old file", "path", l.opts.Path, "error", err)
		return err
	}
	old := l.f
	l.f = f
	return old.Close()
}
