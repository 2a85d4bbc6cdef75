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
			send(readyMsg{gen: g, err: err})
			return
		}
	}
}
