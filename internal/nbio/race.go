//go:build race

package nbio

import (
	"runtime"
	"unsafe"
)

// The race detector's view of the calls, as package syscall gives it for
// read(2) and write(2): the kernel wrote what a read returns and read
// what a write took, and a write happens before the read that sees its
// bytes (through ioSync, as syscall's own ioSync).

var ioSync int64

func raceWriting() { runtime.RaceReleaseMerge(unsafe.Pointer(&ioSync)) }

func raceRead(p []byte) { runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p)) }

func raceWrote(p []byte) {
	runtime.RaceWriteRange(unsafe.Pointer(&p[0]), len(p))
	runtime.RaceAcquire(unsafe.Pointer(&ioSync))
}
