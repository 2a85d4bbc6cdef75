//go:build !linux

package timerslack

import (
	"errors"
	"syscall"
	"time"
)

// Set is Linux only: elsewhere timers keep the system's slack.
func Set(time.Duration) (Result, error) {
	return Result{}, errors.New("timer slack: Linux only")
}

// Of is Linux only.
func Of(int) (time.Duration, error) { return 0, errors.New("timer slack: Linux only") }

// ForkExec is syscall.ForkExec: elsewhere there is no slack to pass on.
func ForkExec(_ time.Duration, argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	return syscall.ForkExec(argv0, argv, attr)
}
