package main

import (
	"bytes"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/hotproxy/hotproxy/config"
)

// TestContainerConfig checks the config the image ships
// (docker/hotproxy.toml) for what `docker run -p 8080:8080` needs: it
// validates as serve would build it, every listener is on all addresses
// (-p cannot reach the container's loopback) and answers directly (no
// backend exists in the image), the admin API stays on loopback (the
// health check does not need it), and the image installs this file, is
// built FROM scratch with no shell step, exposes the port and has a health
// check in exec form. The image itself is built and run with a real
// engine by integration/docker_*_test.go.
func TestContainerConfig(t *testing.T) {
	const path = "../../docker/hotproxy.toml"
	var stdout, stderr bytes.Buffer
	if code := run([]string{"validate", "-c", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate %s: exit %d: %s", path, code, stderr.String())
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Listeners) == 0 || len(cfg.Clusters) != 0 {
		t.Fatalf("want listeners and no clusters (no backend exists in the image), got %d and %d", len(cfg.Listeners), len(cfg.Clusters))
	}
	ports := map[string]bool{}
	for _, l := range cfg.Listeners {
		host, port, err := net.SplitHostPort(l.Address)
		if err != nil {
			t.Fatal(err)
		}
		if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
			t.Errorf("listener %q on %s: not reachable through docker run -p (use 0.0.0.0)", l.Name, l.Address)
		}
		ports[port] = true
		for _, r := range l.Routes {
			if r.DirectResponse == nil {
				t.Errorf("listener %q routes to a cluster; the image has no backend", l.Name)
			}
		}
	}
	if host, _, _ := net.SplitHostPort(cfg.Admin.Address); !net.ParseIP(host).IsLoopback() || cfg.Admin.AllowRemote {
		t.Errorf("admin on %s (allow_remote %v): keep it on loopback in the image", cfg.Admin.Address, cfg.Admin.AllowRemote)
	}

	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d := string(df)
	// The image is built FROM scratch by scripts/image.sh: the config is
	// put in the context's rootfs, which the Dockerfile copies whole.
	script, err := os.ReadFile("../../scripts/image.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `docker/hotproxy.toml "$root/etc/hotproxy/hotproxy.toml"`) {
		t.Error("scripts/image.sh does not install docker/hotproxy.toml as /etc/hotproxy/hotproxy.toml")
	}
	if !regexp.MustCompile(`(?m)^FROM scratch$`).MatchString(d) || !regexp.MustCompile(`(?m)^COPY rootfs/ /$`).MatchString(d) {
		t.Error("the Dockerfile is not FROM scratch with COPY rootfs/ / (the image must build with no registry)")
	}
	if regexp.MustCompile(`(?m)^RUN `).MatchString(d) {
		t.Error("the Dockerfile has a RUN step: the image has no shell to run it")
	}
	m := regexp.MustCompile(`(?m)^EXPOSE (.+)$`).FindStringSubmatch(d)
	if m == nil {
		t.Fatal("no EXPOSE in the Dockerfile")
	}
	for p := range ports {
		if !strings.Contains(" "+m[1]+" ", " "+p+" ") {
			t.Errorf("listener port %s is not in EXPOSE %s", p, m[1])
		}
	}
	// Exec form (CMD [...]): the image has no shell for the shell form.
	if !regexp.MustCompile(`(?m)^HEALTHCHECK .*CMD \["/usr/local/bin/hotproxy", "stats"`).MatchString(d) {
		t.Error("no HEALTHCHECK running hotproxy stats in exec form in the Dockerfile")
	}
}
