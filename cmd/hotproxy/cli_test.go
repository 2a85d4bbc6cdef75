package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLI (issue 15): the top-level flags, the forms of validate and what
// a mistake on the command line prints: one line that says what is wrong
// and where to look, never the whole usage.
func TestCLI(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	badMode := filepath.Join(dir, "mode.toml")
	// TLS: the demo pair beside the config (relative paths are the
	// config's directory's), and a certificate cut in half.
	tlsGood, tlsBad := filepath.Join(dir, "tls.toml"), filepath.Join(dir, "tlsbad.toml")
	xdsGood, xdsMissing := filepath.Join(dir, "xds.toml"), filepath.Join(dir, "xdsmissing.toml")
	xdsBootstrap := func(cluster string) string {
		return "[xds]\ncluster = \"" + cluster + "\"\n[[clusters]]\nname = \"control_plane\"\nendpoints = [\"127.0.0.1:18000\"]\nhttp2 = true\n"
	}
	cert, _ := os.ReadFile("../../examples/tls/a.example.com.pem")
	key, _ := os.ReadFile("../../examples/tls/a.example.com.key")
	tlsListener := func(certFile string) string {
		return "[[listeners]]\nname = \"web-tls\"\naddress = \"127.0.0.1:8443\"\nprotocol = \"http\"\n" +
			"  [listeners.tls]\n  certificates = [{ cert = \"" + certFile + "\", key = \"a.key\" }]\n" +
			"  [[listeners.routes]]\n  prefix = \"/\"\n  direct_response = { status = 200 }\n"
	}
	for path, text := range map[string]string{
		good:                           "[server]\ndrain_time = \"1s\"\n",
		badMode:                        "[stats]\nfile_mode = \"rw-r\"\n",
		xdsGood:                        xdsBootstrap("control_plane"),
		xdsMissing:                     xdsBootstrap("cp"),
		tlsGood:                        tlsListener("a.pem"),
		tlsBad:                         tlsListener("half.pem"),
		filepath.Join(dir, "a.pem"):    string(cert),
		filepath.Join(dir, "a.key"):    string(key),
		filepath.Join(dir, "half.pem"): string(cert[:len(cert)/2]),
	} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name       string
		args       []string
		rc         int
		stdout     []string // each must appear
		stderr     []string
		maxErrLine int // stderr has at most this many lines (0: no bound)
	}{
		{name: "--version", args: []string{"--version"}, stdout: []string{"hotproxy ", "hot-restart protocol", "stats region layout"}},
		{name: "-V", args: []string{"-V"}, stdout: []string{"hot-restart protocol"}},
		{name: "version verb", args: []string{"version"}, stdout: []string{"hot-restart protocol"}},
		{name: "-h", args: []string{"-h"}, stdout: []string{"Usage:", "hotproxy validate"}},
		{name: "--help", args: []string{"--help"}, stdout: []string{"Usage:", "hotproxy supervise"}},
		{name: "help verb", args: []string{"help", "validate"}, stderr: []string{"Usage: hotproxy validate", "-c file"}},
		{name: "validate FILE", args: []string{"validate", good}, stdout: []string{good + ": OK"}},
		{name: "validate -c FILE", args: []string{"validate", "-c", good}, stdout: []string{good + ": OK"}},
		{name: "validate --config FILE", args: []string{"validate", "--config", good}, stdout: []string{good + ": OK"}},
		{name: "validate both", args: []string{"validate", "-c", good, badMode}, rc: exitUsage,
			stderr: []string{"two configs given", "(give one)"}, maxErrLine: 1},
		{name: "validate two files", args: []string{"validate", good, badMode}, rc: exitUsage,
			stderr: []string{"unexpected argument", "hotproxy help validate"}, maxErrLine: 1},
		{name: "validate TLS", args: []string{"validate", tlsGood}, stdout: []string{tlsGood + ": OK"}},
		{name: "validate an xDS bootstrap", args: []string{"validate", xdsGood}, stdout: []string{xdsGood + ": OK"}},
		{name: "validate names the missing control-plane cluster", args: []string{"validate", xdsMissing}, rc: 1,
			stderr: []string{"xds.cluster", `"cp"`, "no such cluster", `static cluster of this file: "control_plane"`}},
		{name: "validate names a broken certificate", args: []string{"validate", tlsBad}, rc: 1,
			stderr: []string{"web-tls", filepath.Join(dir, "half.pem")}},
		{name: "file_mode shows the expected form", args: []string{"validate", badMode}, rc: 1,
			stderr: []string{"stats.file_mode", `"rw-r"`, `"0640"`}, maxErrLine: 1},
		{name: "unknown flag", args: []string{"serve", "--bogus"}, rc: exitUsage,
			stderr: []string{"hotproxy serve: flag provided but not defined: -bogus", "run 'hotproxy help serve'"}, maxErrLine: 1},
		{name: "bad flag value", args: []string{"status", "--base-id", "x"}, rc: exitUsage,
			stderr: []string{"hotproxy status:", "invalid value", "run 'hotproxy help status'"}, maxErrLine: 1},
		{name: "stray argument", args: []string{"reload", "now"}, rc: exitUsage,
			stderr: []string{`hotproxy reload: unexpected argument "now"`, "hotproxy help reload"}, maxErrLine: 1},
		{name: "restart-parent malformed", args: []string{"serve", "--restart-epoch", "1", "--restart-parent", "12:x"}, rc: exitUsage,
			stderr: []string{"hotproxy serve: --restart-parent:", `"12:x"`, "PID:START_TIME", `"none"`}, maxErrLine: 1},
		{name: "restart-parent at epoch 0", args: []string{"serve", "--restart-parent", "none"}, rc: exitUsage,
			stderr: []string{"--restart-parent needs --restart-epoch N > 0"}, maxErrLine: 1},
		{name: "unknown verb", args: []string{"restart"}, rc: exitUsage,
			stderr: []string{`unknown verb "restart"`, "hotproxy help"}, maxErrLine: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			rc := run(tc.args, &stdout, &stderr)
			if rc != tc.rc {
				t.Errorf("exit status %d, want %d\nstdout: %s\nstderr: %s", rc, tc.rc, stdout.String(), stderr.String())
			}
			for _, want := range tc.stdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if n := strings.Count(strings.TrimRight(stderr.String(), "\n"), "\n") + 1; tc.maxErrLine > 0 && n > tc.maxErrLine {
				t.Errorf("stderr has %d lines, want at most %d:\n%s", n, tc.maxErrLine, stderr.String())
			}
		})
	}
}
