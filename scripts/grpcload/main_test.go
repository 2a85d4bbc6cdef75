package main

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// buildTools builds grpcload and grpcbackend into a temporary directory.
func buildTools(t *testing.T) (load, backend string) {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", ".", "../grpcbackend").CombinedOutput()
	if err != nil {
		t.Fatalf("go build grpcload grpcbackend: %v\n%s", err, out)
	}
	return filepath.Join(dir, "grpcload"), filepath.Join(dir, "grpcbackend")
}

// startBackend runs grpcbackend on a free port and returns its address,
// read from the line it prints once it listens.
func startBackend(t *testing.T, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := regexp.MustCompile(` on (\S+) \(h2c\)$`).FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("grpcbackend did not say where it listens within 30s")
		return ""
	}
}

// figures parses grpcload's key=value line.
func figures(t *testing.T, out string) map[string]float64 {
	t.Helper()
	f := map[string]float64{}
	for _, kv := range strings.Fields(out) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			f[k] = n
		}
	}
	for _, k := range []string{"calls", "ok", "failed", "seconds", "calls_per_s"} {
		if _, ok := f[k]; !ok {
			t.Fatalf("grpcload printed no %s=: %q", k, out)
		}
	}
	return f
}

// TestLoadAgainstBackend: real calls to a real grpc-go server all succeed,
// and the figures add up.
func TestLoadAgainstBackend(t *testing.T) {
	load, backend := buildTools(t)
	addr := startBackend(t, backend)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, load, "-addr", addr, "-c", "2", "-m", "3", "-d", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("grpcload: %v\n%s", err, out)
	}
	f := figures(t, string(out))
	if f["ok"] < 1 || f["failed"] != 0 || f["calls"] != f["ok"]+f["failed"] {
		t.Errorf("want some calls, all ok: %s", out)
	}
	if f["seconds"] < 1 {
		t.Errorf("ran %.3fs, want at least the 1s asked: %s", f["seconds"], out)
	}
}

// TestLoadCountsFailures: against a listener that is no gRPC server
// (it closes every connection), every call is counted as failed, the
// first error is named, and grpcload exits non-zero.
func TestLoadCountsFailures(t *testing.T) {
	load, _ := buildTools(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, load, "-addr", l.Addr().String(), "-c", "1", "-m", "2", "-d", "500ms", "-timeout", "200ms").CombinedOutput()
	if err == nil {
		t.Errorf("grpcload exited 0 with no call succeeding: %s", out)
	}
	f := figures(t, string(out))
	if f["ok"] != 0 || f["failed"] < 1 || f["calls"] != f["failed"] {
		t.Errorf("want every call failed: %s", out)
	}
	if !strings.Contains(string(out), "first_error=") {
		t.Errorf("no first_error= in %q", out)
	}
}
