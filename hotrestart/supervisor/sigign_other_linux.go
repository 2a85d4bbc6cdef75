//go:build linux && !amd64 && !arm64

package supervisor

import (
	"os"
	"os/signal"
)

// ignoreForExec, where the kernel's struct sigaction is not the one
// sigign_linux.go knows, falls back on signal.Ignore, with its rare race
// (golang/go#20748: a signal whose handler is running at that moment may
// take its default action). The caller's signal.Notify after a failed
// execve is what undoes it.
func ignoreForExec(sigs []os.Signal) (restore func(), err error) {
	signal.Ignore(sigs...)
	return func() {}, nil
}
