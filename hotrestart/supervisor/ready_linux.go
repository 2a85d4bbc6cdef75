package supervisor

import (
	"errors"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// pipe makes the readiness pipe: a non-blocking read end (so that it has
// deadlines) and a blocking write end for the child.
func pipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "ready-r"), os.NewFile(uintptr(p[1]), "ready-w"), nil
}

// readReady reads one line from a generation's readiness pipe, within
// timeout, and hands it to the loop.
func readReady(g *generation, r *os.File, timeout time.Duration, out chan<- readyMsg, done <-chan struct{}) {
	defer r.Close()
	send := func(m readyMsg) {
		select {
		case out <- m:
		case <-done:
		}
	}
	r.SetReadDeadline(time.Now().Add(timeout))
	var buf []byte
	tmp := make([]byte, 512)
	for {
		n, err := r.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if i := strings.IndexByte(string(buf), '\n'); i >= 0 {
			send(readyMsg{gen: g, line: strings.TrimSpace(string(buf[:i]))})
			return
		}
		if len(buf) > 4096 {
			send(readyMsg{gen: g, line: strings.TrimSpace(string(buf[:4096]))})
			return
		}
		if err != nil {
			if len(buf) > 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
				send(readyMsg{gen: g, line: strings.TrimSpace(string(buf))})
				return
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				waitExited(g.pid, exitReportWait)
			}
			send(readyMsg{gen: g, err: err})
			return
		}
	}
}

// exitReportWait bounds how long a closed readiness pipe waits for its
// generation to become a zombie. The kernel closes a dying process's
// descriptors before it reports the exit, so the pipe's EOF usually wins
// the race against SIGCHLD by a little; a generation that closed the pipe
// and lives on costs this much delay before it is failed and killed.
const exitReportWait = time.Second

// waitExited waits, at most max, until pid has exited, without reaping
// it (WNOWAIT): the loop reaps it and learns its status.
func waitExited(pid int, max time.Duration) {
	deadline := time.Now().Add(max)
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return // not our child any more, or already reaped
		}
		if err == nil && info.Signo == int32(unix.SIGCHLD) {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
