package integration

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestDockerConfigMapReload is the Kubernetes manifest's reload
// (examples/kubernetes.yaml) with a real engine: the config directory is
// laid out and updated the way the kubelet updates a ConfigMap volume (a
// new directory, and a ..data symlink renamed over the old one), bind
// mounted at /etc/hotproxy, and the supervisor runs with --watch-config.
// An update becomes a reload, and the new config serves; an update that
// breaks the config is refused, and the old one serves on. The container
// runs as the manifest's securityContext says (read-only root file system,
// every capability dropped).
func TestDockerConfigMapReload(t *testing.T) {
	e := requireEngine(t)
	v1, _ := e.images(t)
	listen, admin := harness.FreeAddr(t), harness.FreeAddr(t)
	configFor := func(answer string) string {
		return fmt.Sprintf(`[server]
drain_time = "1s"
parent_shutdown_time = "2s"

[admin]
address = %q

[[listeners]]
name = "web"
address = %q
protocol = "http"

  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "%s epoch %%EPOCH%%\n" }
`, admin, listen, answer)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	version := 0
	update := func(content string) {
		t.Helper()
		version++
		name := fmt.Sprintf("..2026_12_01_%06d", version)
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "hotproxy.toml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	update(configFor("first"))
	if err := os.Symlink("..data/hotproxy.toml", filepath.Join(dir, "hotproxy.toml")); err != nil {
		t.Fatal(err)
	}
	base := nextBaseID()
	// The manifest's securityContext too: read-only root, no
	// capabilities, no privilege escalation, /run/hotproxy a volume.
	ct := e.run(t, "configmap", "--network", "host", "-e", "HOTPROXY_BASE_ID="+strconv.Itoa(base),
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/run/hotproxy:uid=10001,gid=10001",
		"-v", dir+":/etc/hotproxy:ro", v1, "--watch-config", "200ms")
	ct.waitServing(base, 0, 60*time.Second)
	answer := func() string {
		t.Helper()
		resp, err := newClient(10 * time.Second).Get("http://" + listen + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := answer(); got != "first epoch 0\n" {
		t.Fatalf("before the update: %q", got)
	}

	update(configFor("second"))
	st := ct.waitServing(base, 1, 30*time.Second)
	if got := answer(); got != "second epoch 1\n" {
		t.Fatalf("after the update: %q (status %+v)", got, st)
	}

	update(configFor("third") + "\nthis is not toml\n")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := ct.status(base); err == nil && st.FailedReloads == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	st = ct.waitServing(base, 1, 10*time.Second)
	if st.FailedReloads != 1 || st.Reloads != 1 {
		t.Errorf("after a broken update: %d reloads and %d failed, want 1 and 1", st.Reloads, st.FailedReloads)
	}
	if got := answer(); got != "second epoch 1\n" {
		t.Errorf("after a broken update: %q, want the second config serving on", got)
	}
	if ct.inspect("{{.State.Running}}") != "true" {
		t.Error("the container stopped after a broken update")
	}
}
