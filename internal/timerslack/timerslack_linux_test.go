//go:build linux

package timerslack

import (
	"errors"
	"io/fs"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSetEveryThread: every thread of the process has the slack after
// Set, and a thread made after it inherits it.
func TestSetEveryThread(t *testing.T) {
	// Threads of their own, parked, so that the process has more than one.
	release := make(chan struct{})
	var started sync.WaitGroup
	for range 3 {
		started.Add(1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	defer close(release)

	const want = 2 * time.Millisecond
	res, err := Set(want)
	if errors.Is(err, fs.ErrPermission) {
		t.Skipf("setting another thread's timer slack needs root or CAP_SYS_NICE: %v", err)
	}
	if err != nil || res.Unset != 0 {
		t.Fatalf("Set(%v) = %+v, %v; want every thread set", want, res, err)
	}
	defer Set(50 * time.Microsecond)
	if res.Threads < 4 {
		t.Fatalf("Set saw %d threads, want at least the 4 this test has", res.Threads)
	}
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if got, err := Of(tid); err != nil || got != want {
			t.Errorf("thread %d: slack %v, %v; want %v", tid, got, err, want)
		}
	}

	// A new thread: one goroutine locked while every other thread is
	// busy or locked makes the runtime start another.
	got := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		n, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
		got <- n
	}()
	if n := <-got; time.Duration(n) != want {
		t.Errorf("a thread made after Set has slack %v, want %v", time.Duration(n), want)
	}
}

// TestForkExecPassesSlack: the child starts with the slack, and the
// parent's thread gets its own back.
func TestForkExecPassesSlack(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The child waits on the pipe until the test has read its slack.
	const want = 3 * time.Millisecond
	pid, err := ForkExec(want, "/bin/sh", []string{"sh", "-c", "read x"}, &syscall.ProcAttr{Files: []uintptr{r.Fd(), 2, 2}})
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	defer func() {
		w.Close()
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}()
	if got, err := Of(pid); err != nil || got != want {
		t.Errorf("the child's slack is %v, %v; want %v", got, err, want)
	}
	after, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if after != before {
		t.Errorf("the forking thread's slack is %d after, %d before", after, before)
	}
}

func TestSetRefusesZero(t *testing.T) {
	if _, err := Set(0); err == nil {
		t.Fatal("Set(0) succeeded, want an error")
	}
}
