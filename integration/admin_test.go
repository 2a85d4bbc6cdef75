package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

func directConfig() harness.Config {
	return harness.Config{
		Concurrency: testConcurrency,
		DrainTime:   "3s",
		Listeners: []harness.Listener{{
			Name:   "web",
			Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "direct\n"}},
		}},
	}
}

// TestAdmin checks the admin API of a serving proxy: readiness, the info
// and config dumps, the methods, and the healthcheck switch.
func TestAdmin(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, directConfig())

	t.Run("ready", func(t *testing.T) {
		if code, body := p.AdminGet("/ready"); code != http.StatusOK {
			t.Errorf("GET /ready: %d %s", code, body)
		}
	})

	t.Run("server_info", func(t *testing.T) {
		info := p.ServerInfo()
		for _, key := range []string{"version", "state", "epoch", "pid", "concurrency", "uptime_current_epoch", "uptime_all_epochs", "hot_restart_version"} {
			if _, ok := info[key]; !ok {
				t.Errorf("server_info has no %q: %v", key, info)
			}
		}
		if pid, ok := info.Int("pid"); !ok || pid != p.PID() {
			t.Errorf("server_info pid %v, want %d", info["pid"], p.PID())
		}
		if epoch, ok := info.Int("epoch"); !ok || epoch != 0 {
			t.Errorf("server_info epoch %v, want 0", info["epoch"])
		}
		if n, ok := info.Int("concurrency"); !ok || n != testConcurrency {
			t.Errorf("server_info concurrency %v, want %d", info["concurrency"], testConcurrency)
		}
		if info.String("version") == "" || info.String("hot_restart_version") == "" {
			t.Errorf("server_info version %q hot_restart_version %q: want both", info.String("version"), info.String("hot_restart_version"))
		}
		t.Logf("state %q", info.String("state"))
	})

	t.Run("config_dump", func(t *testing.T) {
		code, body := p.AdminGet("/config_dump")
		if code != http.StatusOK {
			t.Fatalf("GET /config_dump: %d %s", code, body)
		}
		var dump struct {
			Admin struct {
				Address string `json:"address"`
			} `json:"admin"`
			Listeners []struct {
				Name    string `json:"name"`
				Address string `json:"address"`
			} `json:"listeners"`
		}
		if err := json.Unmarshal(body, &dump); err != nil {
			t.Fatalf("config_dump is not JSON: %v\n%s", err, body)
		}
		if dump.Admin.Address != p.AdminAddr || len(dump.Listeners) != 1 || dump.Listeners[0].Name != "web" || dump.Listeners[0].Address != p.Addr("web") {
			t.Errorf("config_dump does not match the config:\n%s", body)
		}
	})

	t.Run("wrong method", func(t *testing.T) {
		for _, path := range []string{"/quitquitquit", "/healthcheck/fail", "/healthcheck/ok"} {
			if code, _ := p.AdminGet(path); code != http.StatusMethodNotAllowed {
				t.Errorf("GET %s: %d, want 405", path, code)
			}
		}
		if p.Exited() {
			t.Fatal("GET /quitquitquit stopped the process")
		}
	})

	t.Run("healthcheck fail and ok", func(t *testing.T) {
		if code, body := p.AdminPost("/healthcheck/fail"); code != http.StatusOK {
			t.Fatalf("POST /healthcheck/fail: %d %s", code, body)
		}
		if code, _ := p.AdminGet("/ready"); code != http.StatusServiceUnavailable {
			t.Errorf("GET /ready after /healthcheck/fail: %d, want 503", code)
		}
		// Out of rotation is not out of service: traffic still flows.
		if resp, body := get(t, newClient(5*time.Second), p.URL("web", "/")); resp.StatusCode != http.StatusOK || body != "direct\n" {
			t.Errorf("traffic while healthcheck failed: %s %q", resp.Status, body)
		}
		if code, body := p.AdminPost("/healthcheck/ok"); code != http.StatusOK {
			t.Fatalf("POST /healthcheck/ok: %d %s", code, body)
		}
		if code, _ := p.AdminGet("/ready"); code != http.StatusOK {
			t.Errorf("GET /ready after /healthcheck/ok: %d, want 200", code)
		}
	})
}

// TestAdminRefusesCrossSite is issue 8, item 13 against the real binary:
// what a web page on another site can make a browser send to the admin
// API is refused and changes nothing; curl -X POST still works.
func TestAdminRefusesCrossSite(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, directConfig())
	client := newClient(5 * time.Second)
	for _, tc := range []struct {
		name, path string
		headers    map[string]string
		body       string
	}{
		{"cross-origin text/plain", "/quitquitquit", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}, "x"},
		{"text/plain without Origin", "/healthcheck/fail", map[string]string{"Content-Type": "text/plain"}, "x"},
		{"Origin of another site", "/healthcheck/fail", map[string]string{"Origin": "http://evil.example"}, ""},
	} {
		var body io.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		req, err := http.NewRequest(http.MethodPost, "http://"+p.AdminAddr+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: POST %s: %s %q, want 403", tc.name, tc.path, resp.Status, msg)
		}
		if code, body := p.AdminGet("/ready"); code != http.StatusOK {
			t.Fatalf("%s: /ready %d %q after a refused request, want 200", tc.name, code, body)
		}
		if p.Exited() {
			t.Fatalf("%s: the proxy exited after a refused request", tc.name)
		}
	}
	if code, body := p.AdminPost("/healthcheck/fail"); code != http.StatusOK {
		t.Fatalf("curl-style POST /healthcheck/fail: %d %s", code, body)
	}
	if code, _ := p.AdminGet("/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready after a curl-style POST /healthcheck/fail: %d, want 503", code)
	}
}

// TestQuitQuitQuit checks that POST /quitquitquit drains and exits 0.
func TestQuitQuitQuit(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, directConfig())
	if code, body := p.AdminPost("/quitquitquit"); code != http.StatusOK {
		t.Fatalf("POST /quitquitquit: %d %s", code, body)
	}
	code, err := p.Wait(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("exit code %d after /quitquitquit, want 0", code)
	}
}

// TestSIGINT checks that SIGINT drains and exits 0 like SIGTERM.
func TestSIGINT(t *testing.T) {
	t.Parallel()
	p := harness.Start(t, directConfig())
	p.Signal(os.Interrupt)
	code, err := p.Wait(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("exit code %d after SIGINT, want 0", code)
	}
	if strings.Contains(p.Stderr(), "panic") {
		t.Errorf("panic in the logs:\n%s", p.Stderr())
	}
}
