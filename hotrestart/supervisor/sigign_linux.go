//go:build linux && (amd64 || arm64)

package supervisor

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelSigaction is the kernel's struct sigaction on linux/amd64 and
// linux/arm64 (both define SA_RESTORER, so both have sa_restorer).
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const sigIgn = 1 // SIG_IGN

// ignoreForExec makes the kernel ignore sigs until the execve (ignored
// dispositions survive it, handled ones do not) and returns what puts
// Go's handlers back if the execve fails.
//
// Not signal.Ignore: it clears the runtime's "wanted" bit before it sets
// its "ignored" bit, so a signal whose handler is already running on
// another thread in between takes its default action, and SIGHUP
// terminates the supervisor (golang/go#20748; CI saw it under a flood of
// SIGHUP during `reload --supervisor`). Here the runtime's own state is
// not touched at all: a handler already running delivers to the channel,
// which is drained before the execve, and no new one starts.
func ignoreForExec(sigs []os.Signal) (restore func(), err error) {
	saved := make([]kernelSigaction, len(sigs))
	undo := func(n int) {
		for i := range n {
			sig := sigs[i].(unix.Signal)
			unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&saved[i])), 0, 8, 0, 0)
		}
	}
	ign := kernelSigaction{handler: sigIgn}
	for i, s := range sigs {
		sig := s.(unix.Signal)
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&ign)), uintptr(unsafe.Pointer(&saved[i])), 8, 0, 0); e != 0 {
			undo(i)
			return nil, fmt.Errorf("rt_sigaction(%v, SIG_IGN): %w", sig, e)
		}
	}
	return func() { undo(len(sigs)) }, nil
}
