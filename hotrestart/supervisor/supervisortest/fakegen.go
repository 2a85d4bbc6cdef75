// Package supervisortest is a fake hotproxy generation for the
// supervisor's tests: a program that speaks exactly the command-line
// contract of `hotproxy serve` that the supervisor drives (--base-id,
// --restart-epoch, --allow-cold-start, --ready-fd, READY/FAILED, exit 0 on
// SIGTERM, drain and exit after handing over, resume when the next one dies
// within the commit window), without being a proxy. Tests re-execute their
// own binary as it (tableflip style): call MaybeRun first thing in
// TestMain or an init function.
package supervisortest

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// Environment variables that steer a fake generation.
const (
	// EnvFake set to "1" makes MaybeRun run the fake generation.
	EnvFake = "HOTPROXY_FAKEGEN"
	// EnvReadyDelay delays readiness (a Go duration).
	EnvReadyDelay = "HOTPROXY_FAKEGEN_READY_DELAY"
	// EnvDrain is how long a handed-over generation drains (default 100ms).
	EnvDrain = "HOTPROXY_FAKEGEN_DRAIN"
	// EnvCrashOnce names a file: the first generation with epoch > 0 that
	// finds it missing creates it and exits with status 3 right after READY.
	EnvCrashOnce = "HOTPROXY_FAKEGEN_CRASH_ONCE"
	// EnvOrphan makes each generation start a `sleep 0.3` it never waits
	// for: it becomes an orphan of whoever reaps orphans.
	EnvOrphan = "HOTPROXY_FAKEGEN_ORPHAN"
	// EnvFailEpochs is a comma-separated list of epochs that fail to
	// start (FAILED on the readiness fd, exit 1).
	EnvFailEpochs = "HOTPROXY_FAKEGEN_FAIL_EPOCHS"
	// EnvKillEpochs is a comma-separated list of epochs that die by
	// SIGKILL before they are ready, without a word on the readiness fd:
	// a crash.
	EnvKillEpochs = "HOTPROXY_FAKEGEN_KILL_EPOCHS"
	// EnvHangEpochs is a comma-separated list of epochs that never become
	// ready (and ignore SIGTERM).
	EnvHangEpochs = "HOTPROXY_FAKEGEN_HANG_EPOCHS"
	// EnvEvents names a file that gets one line per event: "ready E P",
	// "usr1 E P", "term E P", "drain E P", "resume E P".
	EnvEvents = "HOTPROXY_FAKEGEN_EVENTS"
)

// MaybeRun runs the fake generation and exits when EnvFake is "1"; it
// returns otherwise.
func MaybeRun() {
	if os.Getenv(EnvFake) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
}

// SocketName is the fake restart socket of a generation (abstract).
func SocketName(baseID, epoch int) string {
	return fmt.Sprintf("@hotproxy-fake.%d.%d", baseID, epoch)
}

// Main is the fake `hotproxy serve`; it returns the exit status.
func Main(args []string) int {
	if len(args) == 0 || args[0] != "serve" {
		fmt.Fprintln(os.Stderr, "fakegen: want serve")
		return 2
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("c", "", "")
	baseID := fs.Int("base-id", 0, "")
	epoch := fs.Int("restart-epoch", 0, "")
	readyFD := fs.Int("ready-fd", -1, "")
	cold := fs.Bool("allow-cold-start", false, "")
	fs.String("restart-parent", "", "")
	fs.Int("supervisor-fd", -1, "")
	fs.String("log-level", "", "")
	fs.String("log-format", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var ready io.WriteCloser = nopCloser{io.Discard}
	if *readyFD >= 0 {
		ready = os.NewFile(uintptr(*readyFD), "ready")
	}
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintf(ready, "FAILED %s\n", strings.ReplaceAll(msg, "\n", " "))
		ready.Close()
		fmt.Fprintf(os.Stderr, "fakegen epoch %d: %s\n", *epoch, msg)
		return 1
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return fail("%v", err)
	}
	if inList(os.Getenv(EnvFailEpochs), *epoch) {
		return fail("epoch %d told to fail by %s", *epoch, EnvFailEpochs)
	}
	if inList(os.Getenv(EnvKillEpochs), *epoch) {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if inList(os.Getenv(EnvHangEpochs), *epoch) {
		signal.Ignore(syscall.SIGTERM)
		select {}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	if os.Getenv(EnvOrphan) == "1" {
		exec.Command("sleep", "0.3").Start()
	}
	if d, err := time.ParseDuration(os.Getenv(EnvReadyDelay)); err == nil {
		time.Sleep(d)
	}
	ln, err := net.Listen("unix", SocketName(*baseID, *epoch))
	if err != nil {
		return fail("restart socket: %v", err)
	}
	if *epoch > 0 {
		c, err := net.DialTimeout("unix", SocketName(*baseID, *epoch-1), time.Second)
		switch {
		case err != nil && !*cold:
			return fail("no generation %d answers on %s: %v", *epoch-1, SocketName(*baseID, *epoch-1), err)
		case err == nil:
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "drain %d\n", os.Getpid())
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil || line != "ok\n" {
				return fail("generation %d did not take the drain: %q %v", *epoch-1, line, err)
			}
		}
	}
	fmt.Fprintf(ready, "READY %d\n", os.Getpid())
	ready.Close()
	event("ready", *epoch)
	if f := os.Getenv(EnvCrashOnce); f != "" && *epoch > 0 {
		if _, err := os.Stat(f); os.IsNotExist(err) {
			os.WriteFile(f, []byte("crashed\n"), 0o644)
			time.Sleep(50 * time.Millisecond)
			return 3
		}
	}
	drains := make(chan int, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			var pid int
			if _, err := fmt.Sscanf(line, "drain %d", &pid); err == nil {
				io.WriteString(c, "ok\n")
				drains <- pid
			}
			c.Close()
		}
	}()
	drainTime := 100 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(EnvDrain)); err == nil {
		drainTime = d
	}
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGUSR1:
				event("usr1", *epoch)
			case syscall.SIGUSR2:
				event("usr2", *epoch)
			case syscall.SIGTERM, syscall.SIGINT:
				event("term", *epoch)
				time.Sleep(20 * time.Millisecond)
				return 0
			}
		case child := <-drains:
			event("drain", *epoch)
			// Resume if the child dies within the commit window.
			deadline := time.Now().Add(cfg.HotRestart.CommitWindow.D())
			died := false
			for time.Now().Before(deadline) && !died {
				time.Sleep(10 * time.Millisecond)
				died = !alive(child)
			}
			if died {
				event("resume", *epoch)
				continue
			}
			time.Sleep(drainTime)
			return 0
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func event(what string, epoch int) {
	f := os.Getenv(EnvEvents)
	if f == "" {
		return
	}
	fh, err := os.OpenFile(f, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(fh, "%s %d %d\n", what, epoch, os.Getpid())
	fh.Close()
}

func inList(list string, epoch int) bool {
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == strconv.Itoa(epoch) {
			return true
		}
	}
	return false
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
