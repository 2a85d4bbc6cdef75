package supervisor

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// supervisedSignals are the signals the supervisor acts on.
var supervisedSignals = []os.Signal{unix.SIGCHLD, unix.SIGHUP, unix.SIGTERM, unix.SIGINT, unix.SIGUSR1, unix.SIGUSR2}

// handedOverSignals are ignored across a re-execution (their default
// action would end the supervisor) and handed to the new image.
var handedOverSignals = []os.Signal{unix.SIGHUP, unix.SIGTERM, unix.SIGINT, unix.SIGUSR1, unix.SIGUSR2}

// signalQueue is how many signals wait for the loop before more of the
// same kind are coalesced by os/signal.
const signalQueue = 64

// earlySignals, in an image started by a re-execution, is where signals go
// from this package's initialisation on, before main has even parsed its
// flags: the previous image ignored them for the execve, and the shorter
// that lasts, the fewer are lost.
var earlySignals chan os.Signal

func init() {
	if _, resuming := os.LookupEnv(EnvState); resuming {
		earlySignals = make(chan os.Signal, signalQueue)
		signal.Notify(earlySignals, supervisedSignals...)
	}
}
