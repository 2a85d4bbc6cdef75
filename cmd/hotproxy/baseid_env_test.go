package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBaseIDFromEnvironment: $HOTPROXY_BASE_ID is the default of
// --base-id (what a container's `docker exec` and HEALTHCHECK inherit),
// the flag wins over it, and a value that is no base-id is refused naming
// the variable.
func TestBaseIDFromEnvironment(t *testing.T) {
	stats := func(args ...string) (int, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"stats"}, args...), &stdout, &stderr)
		return code, stderr.String()
	}
	t.Setenv(envBaseID, "987654")
	if code, errOut := stats(); code != 1 || !strings.Contains(errOut, "/dev/shm/hotproxy.987654.stats") {
		t.Errorf("%s=987654, stats: exit %d, %q; want it to read /dev/shm/hotproxy.987654.stats", envBaseID, code, errOut)
	}
	if code, errOut := stats("--base-id", "987653"); code != 1 || !strings.Contains(errOut, "/dev/shm/hotproxy.987653.stats") {
		t.Errorf("stats --base-id 987653 with %s=987654: exit %d, %q; want the flag to win", envBaseID, code, errOut)
	}
	for _, bad := range []string{"x", "-1", "1.5"} {
		t.Setenv(envBaseID, bad)
		if code, errOut := stats(); code != exitUsage || !strings.Contains(errOut, envBaseID) {
			t.Errorf("%s=%q: exit %d, %q; want %d naming the variable", envBaseID, bad, code, errOut, exitUsage)
		}
	}
}
