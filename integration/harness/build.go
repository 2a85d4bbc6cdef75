// Package harness runs hotproxy end to end: it builds the binary once per
// test process, starts generations on loopback with their output captured,
// waits for readiness by polling the admin API, and provides the backends a
// proxy is tested against (HTTP, TCP echo, a closed port). Every helper takes
// a testing.TB, calls tb.Helper and registers its own cleanup; processes are
// only ever killed by the pid the harness started.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvBinary names an environment variable that, when set, is the path of a
// prebuilt hotproxy binary to use instead of building one.
const EnvBinary = "HOTPROXY_BIN"

// DefaultBuildTimeout bounds `go build ./cmd/hotproxy`.
const DefaultBuildTimeout = 5 * time.Minute

var build struct {
	once sync.Once
	path string
	dir  string // temporary build directory, removed by Main
	err  error
}

// Binary returns the path of the hotproxy binary under test: $HOTPROXY_BIN if
// set, else one built from this module's cmd/hotproxy, once per test process.
// A build failure fails (or, the first time, reports) every caller.
func Binary(tb testing.TB) string {
	tb.Helper()
	build.once.Do(func() { build.path, build.dir, build.err = buildBinary() })
	if build.err != nil {
		tb.Fatalf("hotproxy binary: %v", build.err)
	}
	return build.path
}

func buildBinary() (path, dir string, err error) {
	if p := os.Getenv(EnvBinary); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", "", fmt.Errorf("%s=%q: %w", EnvBinary, p, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", "", fmt.Errorf("%s=%q: %w", EnvBinary, p, err)
		}
		return abs, "", nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", "hotproxy-bin-")
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "hotproxy")
	ctx, cancel := context.WithTimeout(context.Background(), DefaultBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", path, "./cmd/hotproxy")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build ./cmd/hotproxy in %s: %w\n%s", root, err, out.String())
	}
	return path, dir, nil
}

// ModuleRoot returns the directory holding this module's go.mod, from
// `go env GOMOD`.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside a module")
	}
	return filepath.Dir(gomod), nil
}

// Main runs the tests and then removes the binary it built, if any. Use it
// from TestMain: os.Exit(harness.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	return code
}

// CopyExecutable copies the program src to dst, mode 0755, and returns
// dst. The copy is made by a cp(1) child, not by this process: a file
// this process had open for writing could be inherited, for the moment
// between fork and exec, by a child another test starts meanwhile, and
// exec'ing dst while any such child holds it fails with ETXTBSY ("text
// file busy", golang.org/issue/22315). cp's descriptor ends with cp.
func CopyExecutable(tb testing.TB, src, dst string) string {
	tb.Helper()
	if out, err := exec.Command("cp", "--", src, dst).CombinedOutput(); err != nil {
		tb.Fatalf("cp %s %s: %v\n%s", src, dst, err, out)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dst
}
