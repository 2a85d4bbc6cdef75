//go:build linux

package timerslack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxPasses bounds Set's looks at the thread list: a thread made while a
// pass runs, by a thread not yet set, starts with the old slack and shows
// up in the next pass; the runtime makes few threads, and none in a loop.
const maxPasses = 8

// Set gives every thread of this process the timer slack slack: the
// calling thread through prctl(PR_SET_TIMERSLACK), every other one
// through /proc/TID/timerslack_ns. A thread the kernel makes later
// inherits the slack of the thread that makes it, so once all have it,
// all will. A process that was started with it (hotproxy supervise
// starts its generations so, as does systemd's TimerSlackNSec=) has it
// on every thread already and needs no privilege, whereas reading or
// setting another thread's needs CAP_SYS_NICE. The error names the
// first thread that kept another slack and why; Result says how many
// did.
func Set(slack time.Duration) (Result, error) {
	if slack <= 0 {
		return Result{}, fmt.Errorf("timer slack %v: must be above 0", slack)
	}
	ns := int64(slack)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Every thread descends from the one exec started, and a thread has
	// its maker's slack: if this one has the slack, the process was
	// started with it and every thread has it. Without CAP_SYS_NICE the
	// others could not even be read to see.
	if own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0); err == nil && int64(own) == ns {
		tids, err := threads()
		return Result{Threads: len(tids)}, err
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return Result{}, fmt.Errorf("prctl(PR_SET_TIMERSLACK, %d): %w", ns, err)
	}
	seen := map[int]bool{}
	var res Result
	var firstErr error
	for pass := 0; pass < maxPasses; pass++ {
		tids, err := threads()
		if err != nil {
			return res, err
		}
		fresh := false
		res, firstErr = Result{Threads: len(tids)}, nil
		for _, tid := range tids {
			if !seen[tid] {
				seen[tid], fresh = true, true
			}
			if err := setThread(tid, ns); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					res.Threads-- // it has exited
					continue
				}
				res.Unset++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		if !fresh {
			break
		}
	}
	if firstErr != nil && errors.Is(firstErr, fs.ErrPermission) {
		firstErr = fmt.Errorf("%w (setting another thread's timer slack needs root or CAP_SYS_NICE)", firstErr)
	}
	return res, firstErr
}

// Of returns thread tid's timer slack.
func Of(tid int) (time.Duration, error) {
	b, err := os.ReadFile(slackFile(tid))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", slackFile(tid), b, err)
	}
	return time.Duration(n), nil
}

// ForkExec is syscall.ForkExec with the child's first thread, and so
// every thread it will make, given the timer slack slack: the calling
// thread takes it for the fork and gets its own back after. Slack 0 (or
// a failed prctl) forks as syscall.ForkExec does.
func ForkExec(slack time.Duration, argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if slack <= 0 {
		return syscall.ForkExec(argv0, argv, attr)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil || unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0) != nil {
		return syscall.ForkExec(argv0, argv, attr)
	}
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0)
	return syscall.ForkExec(argv0, argv, attr)
}

// setThread gives thread tid the slack ns unless it has it.
func setThread(tid int, ns int64) error {
	cur, err := Of(tid)
	if err != nil {
		return err
	}
	if int64(cur) == ns {
		return nil
	}
	// /proc/TID (not /proc/self/task/TID, which has no timerslack_ns):
	// any thread of this process, by its id.
	if err := os.WriteFile(slackFile(tid), []byte(strconv.FormatInt(ns, 10)), 0); err != nil {
		return fmt.Errorf("thread %d: %w", tid, err)
	}
	return nil
}

func slackFile(tid int) string { return "/proc/" + strconv.Itoa(tid) + "/timerslack_ns" }

// threads lists the ids of this process's threads.
func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("listing this process's threads: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
