package harness

import (
	"fmt"
	"os/exec"
	"testing"
)

// LaunchWithOpenFileLimit is Launch with the process's open-file limit
// (RLIMIT_NOFILE, soft and hard) set to nofile: util-linux prlimit(1)
// sets it and execs hotproxy in its own place, so PID and the process
// helpers are hotproxy's. The test is skipped where prlimit is missing.
func LaunchWithOpenFileLimit(tb testing.TB, cfg string, nofile int, args ...string) *Proxy {
	tb.Helper()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		tb.Skipf("setting hotproxy's open-file limit needs prlimit (util-linux): %v", err)
	}
	path := WriteConfig(tb, cfg)
	args, _ = withBaseID(args)
	p := newProxy(tb, path)
	p.parseConfig(cfg)
	p.wrap = []string{prlimit, fmt.Sprintf("--nofile=%d:%d", nofile, nofile), "--"}
	p.start(append([]string{"serve", "-c", path}, args...))
	return p
}
