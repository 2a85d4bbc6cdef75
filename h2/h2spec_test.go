package h2

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

func findH2spec() string {
	if p := os.Getenv("H2SPEC"); p != "" {
		return p
	}
	if p, err := exec.LookPath("h2spec"); err == nil {
		return p
	}
	if _, err := os.Stat("/root/go/bin/h2spec"); err == nil {
		return "/root/go/bin/h2spec"
	}
	return ""
}

var h2specSummary = regexp.MustCompile(`(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed`)

// TestH2spec runs the HTTP/2 conformance suite against an h2c and a TLS
// listener: every test must pass.
func TestH2spec(t *testing.T) {
	bin := findH2spec()
	if bin == "" {
		t.Skip("h2spec not found: set $H2SPEC, put it in PATH, or go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible")
	}
	// A short stall timeout: h2spec leaves streams with closed windows.
	cfg := &ServerConfig{WriteStallTimeout: 2 * time.Second}
	for _, mode := range []string{"h2c", "tls"} {
		t.Run(mode, func(t *testing.T) {
			var tlsConf *tls.Config
			args := []string{"-h", "127.0.0.1", "-o", "5"}
			if mode == "tls" {
				tlsConf = selfSignedTLS(t)
				args = append(args, "-t", "-k")
			}
			ts := startServer(t, cfg, answerHandler, tlsConf)
			_, port, _ := net.SplitHostPort(ts.addr())
			args = append(args, "-p", port)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			m := h2specSummary.FindSubmatch(out)
			if m == nil {
				t.Fatalf("h2spec %v: no summary line (err %v):\n%s", args, err, out)
			}
			total, _ := strconv.Atoi(string(m[1]))
			passed, _ := strconv.Atoi(string(m[2]))
			failed, _ := strconv.Atoi(string(m[4]))
			t.Logf("h2spec %s: %d tests, %d passed, %s skipped, %d failed", mode, total, passed, m[3], failed)
			if failed != 0 || passed == 0 {
				t.Errorf("h2spec %s: %d failed, %d passed:\n%s", mode, failed, passed, out)
			}
		})
	}
}
