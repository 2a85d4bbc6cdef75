package nbio

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// A write to a socket whose peer has gone fails with EPIPE and raises no
// SIGPIPE (sendto's MSG_NOSIGNAL): write(2) would raise one for every
// such write, a signal delivery the runtime then has to handle.
func TestWriteToGonePeerRaisesNoSIGPIPE(t *testing.T) {
	a, b := socketPair(t)
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	// The barrier: SIGWINCH, raised after the write. A SIGPIPE from the
	// write is raised while the write returns, so before it; and the
	// runtime hands pending signals to os/signal lowest number first
	// (SIGPIPE 13, SIGWINCH 28), so once SIGWINCH is here a SIGPIPE
	// would be too.
	barrier := make(chan os.Signal, 1)
	signal.Notify(barrier, syscall.SIGWINCH)
	defer signal.Stop(barrier)

	syscall.Close(int(b))
	if n, err := Write(a, []byte("x")); n != 0 || !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write to a closed peer = %d, %v; want 0, EPIPE", n, err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	select {
	case <-barrier:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGWINCH not delivered within 10s")
	}
	select {
	case <-pipes:
		t.Fatal("the write raised SIGPIPE")
	default:
	}
}

// The calls are recvfrom(2) and sendto(2): a descriptor that is not a
// socket is refused, with the error that says so.
func TestNotASocket(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := Write(w.Fd(), []byte("x")); !errors.Is(err, syscall.ENOTSOCK) {
		t.Errorf("Write to a pipe: %v, want ENOTSOCK", err)
	}
	if _, err := Read(r.Fd(), make([]byte, 1)); !errors.Is(err, syscall.ENOTSOCK) {
		t.Errorf("Read from a pipe: %v, want ENOTSOCK", err)
	}
}

// WriteMore's bytes arrive, the tail it held going with the FIN of the
// shutdown that follows (workers' TestCloseSendsLastResponseWithFIN
// counts the segments).
func TestWriteMoreThenShutdown(t *testing.T) {
	a, b := socketPair(t)
	if n, err := WriteMore(a, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("WriteMore = %d, %v; want 5, nil", n, err)
	}
	if err := syscall.Shutdown(int(a), syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 16)
	n, err := Read(b, p)
	if err != nil || string(p[:n]) != "hello" {
		t.Fatalf("Read = %q, %v; want \"hello\", nil", p[:n], err)
	}
	if n, err := Read(b, p); n != 0 || err != nil {
		t.Fatalf("Read at the end = %d, %v; want 0, nil", n, err)
	}
}
