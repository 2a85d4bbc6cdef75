package server

import (
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
)

// adminRequest sends one request to the admin API, as a browser or a tool
// would, and returns the status and body.
type adminRequest struct {
	name    string
	method  string
	path    string
	host    string // Host header; "" = the admin address
	headers map[string]string
	body    string
}

func (ar adminRequest) do(tb testing.TB, adminURL string) (int, string) {
	tb.Helper()
	var body io.Reader
	if ar.body != "" {
		body = strings.NewReader(ar.body)
	}
	req, err := http.NewRequest(ar.method, adminURL+ar.path, body)
	if err != nil {
		tb.Fatal(err)
	}
	if ar.host != "" {
		req.Host = ar.host
	}
	for k, v := range ar.headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", ar.method, ar.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminRefusesCrossSiteMutations is issue 8, item 13: a web page on
// any site could POST text/plain to /healthcheck/fail or /quitquitquit on
// 127.0.0.1:9901 without a CORS preflight, and it was obeyed. Each of
// these requests is something a browser can send; each is refused, and
// nothing changes: /ready stays 200, the generation stays LIVE.
func TestAdminRefusesCrossSiteMutations(t *testing.T) {
	srv, admin, _, done, _ := startServer(t)
	adminHost := strings.TrimPrefix(admin, "http://")
	evil := map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
	tests := []struct {
		req  adminRequest
		code int
		want string // in the body
	}{
		{adminRequest{name: "cross-origin text/plain, as a browser sends it", method: "POST", path: "/healthcheck/fail", headers: evil, body: "x"}, 403, "Sec-Fetch-Site"},
		{adminRequest{name: "cross-origin text/plain to quitquitquit", method: "POST", path: "/quitquitquit", headers: evil, body: "x"}, 403, "another site"},
		{adminRequest{name: "text/plain alone (a browser without Sec-Fetch-Site, Origin stripped)", method: "POST", path: "/quitquitquit", headers: map[string]string{"Content-Type": "text/plain"}, body: "x"}, 403, "send no body"},
		{adminRequest{name: "text/plain with parameters, any case", method: "POST", path: "/healthcheck/fail", headers: map[string]string{"Content-Type": "TEXT/Plain; charset=utf-8"}}, 403, "application/json"},
		{adminRequest{name: "a form post", method: "POST", path: "/quitquitquit", headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: "a=b"}, 403, "x-www-form-urlencoded"},
		{adminRequest{name: "a multipart form post", method: "POST", path: "/quitquitquit", headers: map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, body: "--x--\r\n"}, 403, "multipart/form-data"},
		{adminRequest{name: "a body without Content-Type (fetch of an untyped Blob)", method: "POST", path: "/healthcheck/fail", body: "x"}, 403, "without Content-Type"},
		{adminRequest{name: "Origin of another site, no body", method: "POST", path: "/healthcheck/fail", headers: map[string]string{"Origin": "http://evil.example"}}, 403, `Origin "http://evil.example"`},
		{adminRequest{name: "Origin of another port of this host", method: "POST", path: "/quitquitquit", headers: map[string]string{"Origin": "http://127.0.0.1:1"}}, 403, "Origin"},
		{adminRequest{name: "Origin https of this host", method: "POST", path: "/quitquitquit", headers: map[string]string{"Origin": "https://" + adminHost}}, 403, "Origin"},
		{adminRequest{name: "Origin null (sandboxed frame)", method: "POST", path: "/healthcheck/fail", headers: map[string]string{"Origin": "null"}}, 403, "Origin"},
		{adminRequest{name: "Sec-Fetch-Site same-site", method: "POST", path: "/healthcheck/fail", headers: map[string]string{"Sec-Fetch-Site": "same-site", "Content-Type": "application/json"}, body: "{}"}, 403, "same-site"},
		{adminRequest{name: "DNS rebinding: same origin by a name", method: "POST", path: "/quitquitquit", host: "rebind.evil.example:9901",
			headers: map[string]string{"Origin": "http://rebind.evil.example:9901", "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}, body: "{}"}, 403, "rebinding"},
		{adminRequest{name: "DNS rebinding: reading the config", method: "GET", path: "/config_dump", host: "rebind.evil.example:9901"}, 403, "allow_remote"},
		// An absolute name is resolved through DNS, where plain localhost
		// comes from /etc/hosts: not the loopback name.
		{adminRequest{name: "Host localhost. (trailing dot)", method: "POST", path: "/healthcheck/fail", host: "localhost.:9901"}, 403, "trailing dot"},
		{adminRequest{name: "Host localhost. without port", method: "GET", path: "/config_dump", host: "localhost."}, 403, "trailing dot"},
		{adminRequest{name: "Host 127.0.0.1. (trailing dot)", method: "GET", path: "/config_dump", host: "127.0.0.1.:9901"}, 403, "trailing dot"},
		{adminRequest{name: "Host localhost..", method: "GET", path: "/config_dump", host: "localhost.."}, 403, "allow_remote"},
		{adminRequest{name: "GET a mutating endpoint (an <img> tag)", method: "GET", path: "/healthcheck/fail"}, 405, ""},
		{adminRequest{name: "GET quitquitquit (a link)", method: "GET", path: "/quitquitquit"}, 405, ""},
	}
	// Every mutating endpoint, present and future, is guarded.
	for _, e := range adminEndpoints {
		if method, path, _ := strings.Cut(e.pattern, " "); method == "POST" {
			tests = append(tests, struct {
				req  adminRequest
				code int
				want string
			}{adminRequest{name: "cross-origin text/plain to " + path, method: "POST", path: path, headers: evil, body: "x"}, 403, "403 Forbidden"})
		}
	}
	for _, tc := range tests {
		t.Run(tc.req.name, func(t *testing.T) {
			code, body := tc.req.do(t, admin)
			if code != tc.code || !strings.Contains(body, tc.want) {
				t.Errorf("%s %s: %d %q, want %d with %q", tc.req.method, tc.req.path, code, body, tc.code, tc.want)
			}
			if code, body := get(t, admin+"/ready"); code != http.StatusOK {
				t.Fatalf("after a refused request, /ready: %d %q, want 200: the request changed something", code, body)
			}
			select {
			case <-done:
				t.Fatal("the generation stopped after a refused request")
			default:
			}
			if st := srv.State(); st != StateLive {
				t.Fatalf("state %v after a refused request, want LIVE", st)
			}
		})
	}
}

// TestAdminAcceptsTools: what operators and their tools send keeps
// working: no body and no headers (curl -X POST), a JSON body, the
// admin's own origin, a user's own navigation (Sec-Fetch-Site: none),
// and the names the admin API is reached by on loopback.
func TestAdminAcceptsTools(t *testing.T) {
	_, admin, _, _, _ := startServer(t)
	u, _ := url.Parse(admin)
	port := u.Port()
	steps := []struct {
		req   adminRequest
		ready int // /ready afterwards
	}{
		{adminRequest{name: "curl -X POST", method: "POST", path: "/healthcheck/fail"}, 503},
		{adminRequest{name: "JSON body", method: "POST", path: "/healthcheck/ok", headers: map[string]string{"Content-Type": "application/json"}, body: "{}"}, 200},
		{adminRequest{name: "same origin", method: "POST", path: "/healthcheck/fail",
			headers: map[string]string{"Origin": admin, "Sec-Fetch-Site": "same-origin"}}, 503},
		{adminRequest{name: "the user's own navigation", method: "POST", path: "/healthcheck/ok", headers: map[string]string{"Sec-Fetch-Site": "none"}}, 200},
		{adminRequest{name: "Host localhost", method: "POST", path: "/healthcheck/fail", host: "localhost:" + port}, 503},
		{adminRequest{name: "Host localhost, same origin", method: "POST", path: "/healthcheck/ok", host: "localhost:" + port,
			headers: map[string]string{"Origin": "http://localhost:" + port}}, 200},
	}
	for _, st := range steps {
		if code, body := st.req.do(t, admin); code != http.StatusOK {
			t.Fatalf("%s: POST %s: %d %q, want 200", st.req.name, st.req.path, code, body)
		}
		if code, _ := get(t, admin+"/ready"); code != st.ready {
			t.Fatalf("%s: /ready %d, want %d", st.req.name, code, st.ready)
		}
	}

	// The real thing, when curl is installed.
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Log("curl not installed; the curl-style requests above stand for it")
		return
	}
	out, err := exec.Command(curl, "-sS", "-f", "-X", "POST", admin+"/healthcheck/fail").CombinedOutput()
	if err != nil {
		t.Fatalf("curl -X POST %s/healthcheck/fail: %v\n%s", admin, err, out)
	}
	if code, _ := get(t, admin+"/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready after curl -X POST /healthcheck/fail: %d, want 503", code)
	}
	// curl -d sends a form: refused, with what to do instead.
	out, _ = exec.Command(curl, "-sS", "-d", "", admin+"/healthcheck/ok").CombinedOutput()
	if !strings.Contains(string(out), "403 Forbidden") || !strings.Contains(string(out), "curl -X POST") {
		t.Errorf("curl -d '' /healthcheck/ok: %q, want a 403 saying to use curl -X POST", out)
	}
}

// TestAdminAllowRemoteAcceptsNames: with allow_remote the admin API is
// reached by names (a probe, a dashboard), so the Host check is off; the
// cross-site checks stay.
func TestAdminAllowRemoteAcceptsNames(t *testing.T) {
	_, admin, _, _, _ := startServerWith(t, "allow_remote = true")
	if code, body := (adminRequest{method: "GET", path: "/ready", host: "admin.internal.example:9901"}).do(t, admin); code != http.StatusOK {
		t.Errorf("GET /ready by name with allow_remote: %d %q, want 200", code, body)
	}
	if code, _ := (adminRequest{method: "POST", path: "/healthcheck/fail", headers: map[string]string{"Origin": "http://evil.example"}}).do(t, admin); code != http.StatusForbidden {
		t.Errorf("cross-origin POST with allow_remote: %d, want 403", code)
	}
	if code, _ := get(t, admin+"/ready"); code != http.StatusOK {
		t.Errorf("/ready %d after a refused POST, want 200", code)
	}
}
