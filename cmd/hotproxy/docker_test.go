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
// health check does not need it), and the Dockerfile installs this file,
// exposes the port and has a health check. No container engine runs here:
// scripts/docker-check.sh builds and runs the image where one does.
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
	if !strings.Contains(d, "COPY docker/hotproxy.toml /etc/hotproxy/hotproxy.toml") {
		t.Error("the Dockerfile does not install docker/hotproxy.toml as /etc/hotproxy/hotproxy.toml")
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
	if !regexp.MustCompile(`(?m)^HEALTHCHECK .*\n?.*hotproxy stats`).MatchString(d) {
		t.Error("no HEALTHCHECK reading hotproxy stats in the Dockerfile")
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatalf("no .dockerignore: %v", err)
	}
	for _, want := range []string{".git", "bin/"} {
		if !strings.Contains(string(ignore), want+"\n") {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}
