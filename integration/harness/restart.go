package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// LaunchOptions are the process-level knobs of LaunchFile. The zero value
// starts the harness's binary like Launch does.
type LaunchOptions struct {
	// Args follow "serve -c FILE".
	Args []string
	// Env is added to the test process's environment.
	Env []string
	// ExtraFiles are inherited as fds 3, 4, ... (exec.Cmd.ExtraFiles).
	ExtraFiles []*os.File
	// Credential, if set, runs the process as another user (root only).
	Credential *syscall.Credential
	// Binary, if set, is run instead of Binary(tb).
	Binary string
}

// LaunchFile starts `hotproxy serve -c path ARGS...` with opts, without
// waiting for it to become ready. Unlike Launch, the config file is the
// caller's, so that generations of one hot-restart chain share it. The
// process is killed (by its pid) when the test ends if it still runs.
func LaunchFile(tb testing.TB, path string, opts LaunchOptions) *Proxy {
	tb.Helper()
	p := newProxy(tb, path)
	if b, err := os.ReadFile(path); err == nil {
		p.parseConfig(string(b))
	}
	bin := opts.Binary
	if bin == "" {
		bin = Binary(tb)
	}
	p.cmd = exec.Command(bin, append([]string{"serve", "-c", path}, opts.Args...)...)
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	p.cmd.ExtraFiles = opts.ExtraFiles
	if len(opts.Env) > 0 {
		p.cmd.Env = append(os.Environ(), opts.Env...)
	}
	attr := sysProcAttr()
	attr.Credential = opts.Credential
	p.cmd.SysProcAttr = attr
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	go p.reap()
	tb.Cleanup(p.cleanup)
	return p
}

// Generation is one hotproxy generation of a hot-restart chain, started
// with --ready-fd: it reports "READY <pid>" or "FAILED <reason>" on a pipe.
type Generation struct {
	*Proxy
	BaseID, Epoch int
	// Exec is when the process was started.
	Exec time.Time

	ready chan readyLine
	line  *readyLine // the line once received
}

type readyLine struct {
	text string // without the newline; "" at EOF with nothing said
	at   time.Time
	err  error
}

// StartGeneration launches `hotproxy serve -c path --base-id B
// --restart-epoch N --ready-fd FD` (plus opts.Args) with a pipe on FD, and
// returns without waiting; see WaitReadyFD.
func StartGeneration(tb testing.TB, path string, baseID, epoch int, opts LaunchOptions) *Generation {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatalf("ready pipe: %v", err)
	}
	fd := 3 + len(opts.ExtraFiles)
	opts.ExtraFiles = append(append([]*os.File(nil), opts.ExtraFiles...), w)
	opts.Args = append([]string{
		"--base-id", strconv.Itoa(baseID),
		"--restart-epoch", strconv.Itoa(epoch),
		"--ready-fd", strconv.Itoa(fd),
	}, opts.Args...)
	g := &Generation{BaseID: baseID, Epoch: epoch, ready: make(chan readyLine, 1), Exec: time.Now()}
	g.Proxy = LaunchFile(tb, path, opts)
	w.Close() // the child has its copy: EOF here means it closed or died
	go func() {
		defer r.Close()
		line, err := bufio.NewReader(r).ReadString('\n')
		at := time.Now()
		if errors.Is(err, io.EOF) {
			err = nil // EOF with or without a line: the line says which
		}
		g.ready <- readyLine{text: strings.TrimSuffix(line, "\n"), at: at, err: err}
	}()
	return g
}

// WaitReadyFD waits up to timeout for the generation's line on its ready
// fd. It returns nil for "READY <its pid>", and an error for "FAILED ...",
// for EOF with nothing said, for a READY with another pid, and on timeout.
func (g *Generation) WaitReadyFD(timeout time.Duration) error {
	l, err := g.readyLine(timeout)
	if err != nil {
		return err
	}
	want := fmt.Sprintf("READY %d", g.PID())
	if l.text != want {
		return fmt.Errorf("epoch %d (pid %d) said %q on its ready fd, want %q", g.Epoch, g.PID(), l.text, want)
	}
	return nil
}

// ReadyLine waits up to timeout for the line the generation wrote on its
// ready fd ("" if it closed the fd, or died, without one).
func (g *Generation) ReadyLine(timeout time.Duration) (string, error) {
	l, err := g.readyLine(timeout)
	if err != nil {
		return "", err
	}
	return l.text, nil
}

// ReadyAt is when the ready line was read (zero before it was).
func (g *Generation) ReadyAt() time.Time {
	if g.line == nil {
		return time.Time{}
	}
	return g.line.at
}

func (g *Generation) readyLine(timeout time.Duration) (*readyLine, error) {
	if g.line == nil {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case l := <-g.ready:
			g.line = &l
		case <-t.C:
			return nil, fmt.Errorf("epoch %d (pid %d): nothing on its ready fd within %v", g.Epoch, g.PID(), timeout)
		}
	}
	if g.line.err != nil {
		return nil, fmt.Errorf("epoch %d (pid %d): reading its ready fd: %w", g.Epoch, g.PID(), g.line.err)
	}
	return g.line, nil
}

// ProcState returns the state letter of the running process from
// /proc/PID/stat ('R', 'S', 'T' for stopped, 'Z', ...).
func (p *Proxy) ProcState() (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0, err
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", p.PID(), b)
	}
	return b[i+2], nil
}
