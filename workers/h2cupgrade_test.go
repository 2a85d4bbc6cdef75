package workers

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"golang.org/x/net/http2/hpack"
)

// Issue 20, item 5: "Upgrade: h2c" must not open a tunnel past routing.

// h2cUpgradeBackend is a backend that takes h2c upgrades (golang.org/x/net's
// h2c handler), leniently: it upgrades any request whose Upgrade names
// h2c, as servers that do not insist on "Connection: HTTP2-Settings" do.
// It records the path, protocol and upgrade fields of every request it
// serves, those inside an upgraded connection too.
type h2cUpgradeBackend struct {
	addr string
	mu   sync.Mutex
	seen []string // "proto path upgrade=... settings=..."
}

func newH2CUpgradeBackend(tb testing.TB) *h2cUpgradeBackend {
	tb.Helper()
	be := &h2cUpgradeBackend{}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		be.record(r.Proto + " " + r.URL.Path)
		fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path)
	})
	upgrading := h2c.NewHandler(inner, &http2.Server{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		be.record(fmt.Sprintf("fields upgrade=%q settings=%q", r.Header.Get("Upgrade"), r.Header.Values("Http2-Settings")))
		if strings.Contains(strings.ToLower(r.Header.Get("Upgrade")), "h2c") {
			r.Header.Set("Connection", "Upgrade, HTTP2-Settings")
			if len(r.Header.Values("Http2-Settings")) == 0 {
				r.Header.Set("Http2-Settings", "")
			}
		}
		upgrading.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	be.addr = hostOf(srv.URL)
	return be
}

func (be *h2cUpgradeBackend) record(s string) {
	be.mu.Lock()
	be.seen = append(be.seen, s)
	be.mu.Unlock()
}

func (be *h2cUpgradeBackend) requests() []string {
	be.mu.Lock()
	defer be.mu.Unlock()
	return append([]string(nil), be.seen...)
}

const h2cUpgradeRequest = "GET /public HTTP/1.1\r\nHost: a.example\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"

// testH2CUpgradeRefused sends an h2c upgrade on c: the request must be
// served as plain HTTP/1.1 without Upgrade and HTTP2-Settings, and
// /private (the proxy's own 403) never reach the backend, on that
// connection or in a tunnel.
func testH2CUpgradeRefused(t *testing.T, be *h2cUpgradeBackend, c net.Conn) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, h2cUpgradeRequest); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		status := h2InTunnel(t, c, br, "/private/x")
		t.Fatalf("the proxy passed the h2c upgrade on (101); a stream for the denied /private/x inside the tunnel got %d; backend saw %q", status, be.requests())
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "HTTP/1.1 /public" {
		t.Fatalf("%d %q, want the backend's HTTP/1.1 answer", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Upgrade"); got != "" {
		t.Errorf("response Upgrade %q", got)
	}
	// The same connection stays HTTP/1.1 and routed.
	io.WriteString(c, "GET /private/x HTTP/1.1\r\nHost: a.example\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("GET /private/x after the upgrade attempt: %v %v, want the proxy's 403", resp, err)
	}
	want := []string{`fields upgrade="" settings=[]`, "HTTP/1.1 /public"}
	if got := be.requests(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the backend saw %q, want %q: no Upgrade, no HTTP2-Settings, no /private", got, want)
	}
}

// h2InTunnel speaks HTTP/2 on an upgraded connection (old code's
// failure, shown in full) and returns the status of a GET of path.
func h2InTunnel(t *testing.T, c net.Conn, br *bufio.Reader, path string) int {
	fr := http2.NewFramer(c, io.MultiReader(br, c))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(c, http2.ClientPreface)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "a.example"}, {":path", path}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	for range 100 {
		f, err := fr.ReadFrame()
		if err != nil {
			return -1
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == 3 {
			var status int
			fmt.Sscan(h.PseudoValue("status"), &status)
			return status
		}
	}
	return -1
}

func TestH2CUpgradeNotForwarded(t *testing.T) {
	be := newH2CUpgradeBackend(t)
	m := startManager(t, hostileConfig(be.addr), 1)
	c, err := net.DialTimeout("tcp", addr(t, m, "web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	testH2CUpgradeRefused(t, be, c)
}

func TestH2CUpgradeNotForwardedTLS(t *testing.T) {
	be := newH2CUpgradeBackend(t)
	m := startTLSManager(t, hostileConfig(be.addr, withTLS), 1)
	testH2CUpgradeRefused(t, be, dialTLS(t, addr(t, m, "web"), "a.example.com"))
}

// TestH2CUpgradeCurl: curl --http2 on http:// asks for an h2c upgrade
// and, refused it, takes the HTTP/1.1 answer: the decision to serve such
// a request as HTTP/1.1 rather than answer 4xx keeps this client working.
func TestH2CUpgradeCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed: TestH2CUpgradeNotForwarded covers the upgrade with a raw client")
	}
	be := newH2CUpgradeBackend(t)
	m := startManager(t, hostileConfig(be.addr), 1)
	out, err := exec.Command(curl, "-sS", "--http2", "--max-time", "10", "-w", " %{http_version} %{http_code}",
		"http://"+addr(t, m, "web")+"/public").CombinedOutput()
	if err != nil {
		t.Fatalf("curl --http2: %v: %s", err, out)
	}
	if got := string(out); got != "HTTP/1.1 /public 1.1 200" {
		t.Errorf("curl --http2 got %q, want the backend's HTTP/1.1 answer (\"HTTP/1.1 /public 1.1 200\")", got)
	}
}

// TestUpgradeTo101H2CRefused: an upstream offered WebSocket (the h2c of
// "websocket, h2c" taken out) that switches to h2c anyway gets a 502,
// never a tunnel.
func TestUpgradeTo101H2CRefused(t *testing.T) {
	var mu sync.Mutex
	var got string
	be := rawBackend(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		mu.Lock()
		got = req.Header.Get("Upgrade")
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		io.Copy(io.Discard, c)
	})
	m := startManager(t, proxyConfig(be), 1)
	resp := rawRequest(t, addr(t, m, "web"), "GET / HTTP/1.1\r\nHost: a.example\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 for a 101 to h2c", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if got != "websocket" {
		t.Errorf("the upstream was offered Upgrade %q, want websocket alone", got)
	}
}
