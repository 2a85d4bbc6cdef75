package shm

import (
	"errors"
	"runtime/debug"
)

// errFault marks an operation cut short by a memory fault on the mapping:
// the file shrank under it (see guardFault).
var errFault = errors.New("memory fault on the region mapping: the file shrank (truncated)")

// guardFault runs fn turning a memory fault (SIGBUS on a mapping whose file
// shrank after the size check) into an error wrapping errFault instead of a
// crash. SetPanicOnFault is per goroutine, so this guards only what fn does
// on the calling goroutine.
func guardFault(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if p := recover(); p != nil {
			if e, ok := p.(interface{ Addr() uintptr }); ok {
				err = &FormatError{Reason: errFault.Error(), fault: true, addr: e.Addr()}
				return
			}
			panic(p)
		}
	}()
	return fn()
}

// isFault reports whether err comes from a memory fault caught by
// guardFault.
func isFault(err error) bool {
	var fe *FormatError
	return errors.As(err, &fe) && fe.fault
}
