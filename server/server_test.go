package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
)

// startServer builds and runs a generation on free loopback ports and
// returns it with its admin base URL and its HTTP listener's URL.
// done is closed when Run has returned; *runErr is its result then.
func startServer(tb testing.TB) (srv *Server, adminURL, webURL string, done <-chan struct{}, runErr *error) {
	tb.Helper()
	return startServerWith(tb, "")
}

// startServerWith is startServer with adminKeys added to [admin].
func startServerWith(tb testing.TB, adminKeys string) (srv *Server, adminURL, webURL string, done <-chan struct{}, runErr *error) {
	tb.Helper()
	webAddr := freeAddr(tb)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[server]
concurrency = 2
drain_time = "5s"
parent_shutdown_time = "5s"
[admin]
address = "127.0.0.1:0"
%s
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "hello from %%PID%% epoch %%EPOCH%%" }
`, adminKeys, webAddr)), "test.toml")
	if err != nil {
		tb.Fatalf("config: %v", err)
	}
	isolateStats(tb, cfg)
	srv, err = New(Options{Config: cfg})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	runErr = new(error)
	go func() {
		*runErr = srv.Run(ctx)
		close(finished)
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			tb.Errorf("Run did not return after cancel")
		}
	})
	adminURL = "http://" + srv.AdminAddr().String()
	waitReady(tb, adminURL)
	return srv, adminURL, "http://" + webAddr, finished, runErr
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitReady(tb testing.TB, adminURL string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(adminURL + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("%s/ready never answered 200", adminURL)
}

func get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// post POSTs to url as curl -X POST does: no body, no Content-Type.
func post(tb testing.TB, url string) int {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestServesDirectResponseWithIdentity(t *testing.T) {
	srv, _, web, _, _ := startServer(t)
	code, body := get(t, web+"/anything")
	want := fmt.Sprintf("hello from %d epoch 0", srv.identity.PID)
	if code != 200 || body != want {
		t.Fatalf("got %d %q, want 200 %q", code, body, want)
	}
}

func TestServerInfo(t *testing.T) {
	_, admin, _, _, _ := startServer(t)
	code, body := get(t, admin+"/server_info")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var info ServerInfo
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if info.State != "LIVE" || info.Concurrency != 2 || info.Epoch != 0 ||
		info.Version != version.Version || info.HotRestartVersion != hotrestart.ProtocolVersion || info.PID == 0 {
		t.Fatalf("unexpected server_info: %+v", info)
	}
	if _, err := time.ParseDuration(info.UptimeCurrentEpoch); err != nil {
		t.Errorf("uptime_current_epoch %q: %v", info.UptimeCurrentEpoch, err)
	}
	if _, err := time.ParseDuration(info.UptimeAllEpochs); err != nil {
		t.Errorf("uptime_all_epochs %q: %v", info.UptimeAllEpochs, err)
	}
}

func TestConfigDumpIsEffectiveConfig(t *testing.T) {
	_, admin, _, _, _ := startServer(t)
	code, body := get(t, admin+"/config_dump")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var dump map[string]any
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatalf("decoding: %v", err)
	}
	srvSection, _ := dump["server"].(map[string]any)
	if srvSection["concurrency"] != float64(2) || srvSection["drain_time"] != "5s" {
		t.Fatalf("server section not effective: %v", srvSection)
	}
	listeners, _ := dump["listeners"].([]any)
	if len(listeners) != 1 {
		t.Fatalf("want 1 listener in dump, got %v", dump["listeners"])
	}
	// Keys left out show their effective values, 0 included where 0
	// means something.
	web, _ := listeners[0].(map[string]any)
	adminSection, _ := dump["admin"].(map[string]any)
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"listeners[0].write_timeout", web["write_timeout"], "1m0s"},
		{"listeners[0].trust_forwarded_for", web["trust_forwarded_for"], true},
		{"listeners[0].max_connections", web["max_connections"], float64(0)},
		{"server.max_connections", srvSection["max_connections"], float64(0)},
		{"server.reuse_port", srvSection["reuse_port"], true},
		{"admin.allow_remote", adminSection["allow_remote"], false},
	} {
		if c.got != c.want {
			t.Errorf("config_dump %s = %#v, want %#v", c.key, c.got, c.want)
		}
	}
}

func TestMutatingEndpointsRefuseGET(t *testing.T) {
	_, admin, _, _, _ := startServer(t)
	for _, path := range []string{"/quitquitquit", "/healthcheck/fail", "/healthcheck/ok"} {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(resp.Header.Get("Allow"), "POST") {
			t.Errorf("GET %s: status %d Allow %q, want 405 with Allow: POST", path, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	if code, _ := get(t, admin+"/ready"); code != 200 {
		t.Fatalf("GETs on mutating endpoints changed readiness: %d", code)
	}
}

func TestHealthcheckFailAndOK(t *testing.T) {
	_, admin, web, _, _ := startServer(t)
	if code := post(t, admin+"/healthcheck/fail"); code != 200 {
		t.Fatalf("POST /healthcheck/fail: %d", code)
	}
	if code, body := get(t, admin+"/ready"); code != 503 || !strings.Contains(body, "HEALTHCHECK FAILED") {
		t.Fatalf("/ready after fail: %d %q", code, body)
	}
	// Failing the health check takes the instance out of rotation; it
	// still serves whoever reaches it.
	if code, _ := get(t, web+"/"); code != 200 {
		t.Fatalf("traffic after healthcheck/fail: %d", code)
	}
	post(t, admin+"/healthcheck/ok")
	if code, _ := get(t, admin+"/ready"); code != 200 {
		t.Fatalf("/ready after ok: %d", code)
	}
}

func TestQuitDrainsAndReturns(t *testing.T) {
	srv, admin, web, done, runErr := startServer(t)
	if code := post(t, admin+"/quitquitquit"); code != 200 {
		t.Fatalf("POST /quitquitquit: %d", code)
	}
	select {
	case <-done:
		if *runErr != nil {
			t.Fatalf("Run: %v", *runErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after /quitquitquit")
	}
	if srv.State() != StateDraining {
		t.Fatalf("state after quit: %v", srv.State())
	}
	if _, err := http.Get(web + "/"); err == nil {
		t.Fatal("listener still accepting after the generation stopped")
	}
}

func TestAdminBindFailureNamesAddress(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[admin]
address = %q
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "x" }
`, held.Addr().String(), freeAddr(t))), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	isolateStats(t, cfg)
	srv, err := New(Options{Config: cfg})
	if err == nil {
		srv.Close()
		t.Fatal("New succeeded on a held admin address")
	}
	for _, want := range []string{"admin", held.Addr().String(), "address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestRunningGenerationAdvice: a generation whose restart socket another
// generation of this user holds says what to do, in the words of how it
// was started: by hand, take over with --restart-epoch; under a
// supervisor, which picks the epochs, --take-over or another base-id.
func TestRunningGenerationAdvice(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "web"
address = %q
protocol = "http"
  [[listeners.routes]]
  prefix = "/"
  direct_response = { status = 200, body = "x" }
`, freeAddr(t))), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	isolateStats(t, cfg)
	first, err := New(Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for _, tc := range []struct {
		opts       Options
		want, not  string
		startedHow string
	}{
		{Options{Config: cfg}, "take over from it with --restart-epoch 1", "--take-over", "by hand"},
		{Options{Config: cfg, SupervisorPID: os.Getppid()}, "start the supervisor with --take-over", "--restart-epoch", "under a supervisor"},
	} {
		srv, err := New(tc.opts)
		if err == nil {
			srv.Close()
			t.Fatalf("%s: a second generation of base-id 0, epoch 0 started", tc.startedHow)
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "another --base-id") || strings.Contains(msg, tc.not) {
			t.Errorf("%s: %q, want it to say %q and another --base-id, not %q", tc.startedHow, msg, tc.want, tc.not)
		}
	}
}
