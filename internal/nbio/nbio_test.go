//go:build unix

package nbio

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// socketPair is a connected pair of non-blocking stream sockets, closed
// at the end of the test.
func socketPair(t *testing.T) (a, b uintptr) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if err := syscall.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
	}
	return uintptr(fds[0]), uintptr(fds[1])
}

func TestReadWrite(t *testing.T) {
	a, b := socketPair(t)
	p := make([]byte, 16)
	if n, err := Read(b, p); n != 0 || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("Read with nothing sent = %d, %v; want 0, EAGAIN", n, err)
	}
	if n, err := Write(a, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v; want 5, nil", n, err)
	}
	if n, err := Write(a, nil); n != 0 || err != nil {
		t.Fatalf("Write of nothing = %d, %v; want 0, nil", n, err)
	}
	n, err := Read(b, p)
	if err != nil || !bytes.Equal(p[:n], []byte("hello")) {
		t.Fatalf("Read = %q, %v; want \"hello\", nil", p[:n], err)
	}
	if n, err := Read(b, nil); n != 0 || err != nil {
		t.Fatalf("Read into nothing = %d, %v; want 0, nil (as a net.Conn's Read)", n, err)
	}
	syscall.Shutdown(int(a), syscall.SHUT_WR)
	if n, err := Read(b, p); n != 0 || err != nil {
		t.Fatalf("Read at the end = %d, %v; want 0, nil", n, err)
	}
}

// A full send buffer is EAGAIN, with nothing of the call's bytes taken.
func TestWriteFull(t *testing.T) {
	a, _ := socketPair(t)
	chunk := make([]byte, 64<<10)
	total := 0
	for range 1 << 10 { // the buffer fills in far fewer: a few hundred KiB
		n, err := Write(a, chunk)
		total += n
		if err != nil {
			if !errors.Is(err, syscall.EAGAIN) || n != 0 {
				t.Fatalf("Write into a full buffer = %d, %v; want 0, EAGAIN", n, err)
			}
			if total == 0 {
				t.Fatal("EAGAIN before anything was written")
			}
			return
		}
	}
	t.Fatalf("%d bytes written and the buffer never filled", total)
}

func TestBadDescriptor(t *testing.T) {
	a, _ := socketPair(t)
	fd, err := syscall.Dup(int(a))
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	if n, err := Read(uintptr(fd), make([]byte, 1)); n != 0 || !errors.Is(err, syscall.EBADF) {
		t.Errorf("Read of a closed descriptor = %d, %v; want 0, EBADF", n, err)
	}
	if n, err := Write(uintptr(fd), []byte("x")); n != 0 || !errors.Is(err, syscall.EBADF) {
		t.Errorf("Write to a closed descriptor = %d, %v; want 0, EBADF", n, err)
	}
}

// Neither call allocates: they are on every request's path.
func TestNoAllocation(t *testing.T) {
	a, b := socketPair(t)
	p, msg := make([]byte, 8), []byte("x")
	allocs := testing.AllocsPerRun(100, func() {
		Write(a, msg)
		Read(b, p)
		Read(b, p) // EAGAIN
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per write and two reads, want 0", allocs)
	}
}
