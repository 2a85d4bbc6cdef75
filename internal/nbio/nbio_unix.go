//go:build unix

// Package nbio is reading and writing a non-blocking socket, made as
// raw system calls: without the Go runtime's entersyscall and exitsyscall
// around them, which hand the P over for a call that might block and
// take it back after (and wake sysmon to watch it). A non-blocking
// socket's call returns at once, EAGAIN rather than wait, so the hand-over
// buys nothing: the four calls of an HTTP/1.1 keep-alive request go
// through here, and the brackets around them were ~2 % of the proxy's
// CPU (docs/benchmarks.md). Only for a descriptor in non-blocking mode, as
// every socket of Go's net package is: a call that blocks here would
// stall its P, and every goroutine queued on it, until it returns.
//
// Only for sockets, too: on Linux the calls are recvfrom(2) and
// sendto(2), which go to the socket layer straight, where read(2) and
// write(2) pass through the file layer first (its position lock, its
// range and permission checks, its notification hook: ~0.1 µs a call
// here, docs/benchmarks.md), and a write to a connection the peer has
// reset fails with EPIPE without raising SIGPIPE (MSG_NOSIGNAL). Any
// other descriptor fails there with ENOTSOCK. Elsewhere they are read(2)
// and write(2).
package nbio

import (
	"syscall"
	"unsafe"
)

// Read reads into p from the non-blocking descriptor fd: n bytes (0 at
// the end of the stream), or the error, syscall.EAGAIN when nothing is
// there yet. EINTR is retried. An empty p reads nothing and returns 0,
// nil at once, as a net.Conn's Read does (recvfrom(2) of 0 bytes would
// wait for data like any other).
func Read(fd uintptr, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := call(recvTrap, fd, p, 0)
	if n > 0 {
		raceWrote(p[:n])
	}
	return n, err
}

// Write writes p to the non-blocking descriptor fd: n bytes written, or
// the error (syscall.EAGAIN: the send buffer is full). EINTR is retried.
func Write(fd uintptr, p []byte) (int, error) {
	return send(fd, p, sendFlags)
}

// send is Write with the flags of sendto(2), where there is one.
func send(fd uintptr, p []byte, flags uintptr) (int, error) {
	raceWriting()
	n, err := call(sendTrap, fd, p, flags)
	if n > 0 {
		raceRead(p[:n])
	}
	return n, err
}

// call makes the system call trap(fd, p, len(p), flags, 0, 0) until it
// is not interrupted: recvfrom(2) or sendto(2) without an address, or
// read(2) or write(2), which ignore the last three.
func call(trap, fd uintptr, p []byte, flags uintptr) (int, error) {
	for {
		n, _, e := syscall.RawSyscall6(trap, fd, uintptr(bufPtr(p)), uintptr(len(p)), flags, 0, 0)
		if e != syscall.EINTR {
			return result(n, e)
		}
	}
}

var zeroByte byte

// bufPtr is p's first byte, or a valid address for an empty p (as the
// syscall package passes). Converted to uintptr only in the system
// call's argument list, which keeps what it points to alive and in place
// for the call (unsafe.Pointer's rule 4).
func bufPtr(p []byte) unsafe.Pointer {
	if len(p) == 0 {
		return unsafe.Pointer(&zeroByte)
	}
	return unsafe.Pointer(&p[0])
}

// The common errors as values made once, as package syscall's errnoErr
// keeps them.
var (
	errEAGAIN error = syscall.EAGAIN
	errEINVAL error = syscall.EINVAL
	errENOENT error = syscall.ENOENT
)

func result(n uintptr, e syscall.Errno) (int, error) {
	switch e {
	case 0:
		return int(n), nil
	case syscall.EAGAIN:
		return 0, errEAGAIN
	case syscall.EINVAL:
		return 0, errEINVAL
	case syscall.ENOENT:
		return 0, errENOENT
	}
	return 0, e
}
