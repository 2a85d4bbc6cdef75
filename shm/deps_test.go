package shm

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestNoProxyImports: the reader is linked into the stats CLI and must not
// pull in the proxy (workers, upstream, server, ...). Only shm itself may be
// a hotproxy package among its dependencies.
func TestNoProxyImports(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	const self = "github.com/hotproxy/hotproxy/shm"
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/hotproxy/hotproxy") && p != self {
			t.Errorf("shm depends on %s", p)
		}
	}
}

// TestPackageDoc: every package here has a doc comment.
func TestPackageDoc(t *testing.T) {
	data, err := os.ReadFile("doc.go")
	if err != nil || !strings.Contains(string(data), "// Package shm ") {
		t.Fatal("shm has no package doc comment in doc.go")
	}
}
