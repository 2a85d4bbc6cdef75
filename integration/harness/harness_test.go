package harness

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}

func TestHTTPBackend(t *testing.T) {
	b := StartHTTPBackend(t, "b1")
	base := "http://" + b.Addr

	resp, err := client.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "b1\n" || resp.Header.Get(HeaderBackendID) != "b1" {
		t.Errorf("/: got %q, id %q", body, resp.Header.Get(HeaderBackendID))
	}

	const n = 1<<20 + 17
	for _, q := range []string{"", "&cl=1"} {
		resp, err = client.Get(base + "/bytes?n=1048593" + q)
		if err != nil {
			t.Fatal(err)
		}
		got, sum, err := SHA256Reader(resp.Body)
		resp.Body.Close()
		if err != nil || got != n || sum != PatternSHA256(n) {
			t.Errorf("/bytes%s: %d bytes, sha %s, err %v", q, got, sum, err)
		}
	}

	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	req, _ := http.NewRequest(http.MethodPost, base+"/echo", io.NopCloser(bytes.NewReader(payload))) // chunked
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	echoed, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(echoed, payload) {
		t.Errorf("echo: got %d bytes, want %d", len(echoed), len(payload))
	}
	if _, want, _ := SHA256Reader(bytes.NewReader(payload)); resp.Trailer.Get(HeaderBodySHA256) != want {
		t.Errorf("echo trailer: %q", resp.Trailer.Get(HeaderBodySHA256))
	}

	req, _ = http.NewRequest(http.MethodGet, base+"/slow?ms=50", nil)
	req.Header.Set("X-Forwarded-For", "192.0.2.1")
	req.Header.Set("X-Request-Id", "rid")
	start := time.Now()
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("/slow answered in %v", time.Since(start))
	}
	if s, ok := b.LastSeen(); !ok || s.XForwardedFor != "192.0.2.1" || s.XRequestID != "rid" || s.Path != "/slow?ms=50" {
		t.Errorf("seen: %+v", s)
	}

	resp, err = client.Get(base + "/reset")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("/reset: want ECONNRESET, got %v", err)
	}
	if got := b.Requests(); got != 6 {
		t.Errorf("requests: got %d, want 6", got)
	}
}

func TestTCPEchoBackendHalfClose(t *testing.T) {
	b := StartTCPEchoBackend(t)
	c, err := net.Dial("tcp", b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 4 << 20
	go func() {
		io.Copy(c, PatternReader(n))
		c.(*net.TCPConn).CloseWrite()
	}()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	got, sum, err := SHA256Reader(c)
	if err != nil || got != n || sum != PatternSHA256(n) {
		t.Fatalf("echo: %d bytes, err %v, sha match %v", got, err, sum == PatternSHA256(n))
	}
}

func TestClosedAddrRefuses(t *testing.T) {
	_, err := net.DialTimeout("tcp", ClosedAddr(t), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("want ECONNREFUSED, got %v", err)
	}
}

func TestConfigTOMLParses(t *testing.T) {
	c := Config{
		Concurrency: 2,
		DrainTime:   "3s",
		LogLevel:    "debug",
		Listeners: []Listener{
			{Name: "web", Routes: []Route{
				{Path: "/direct", Status: 418, Body: "tea \"pot\"\n"},
				{Host: "*.example.com", Prefix: "/", Cluster: "backend"},
			}, RequestTimeout: "5s", MaxHeaderBytes: 8192},
			{Name: "tcp", Protocol: "tcp", Cluster: "backend", IdleTimeout: "1m"},
		},
		Clusters: []Cluster{{Name: "backend", LBPolicy: "round_robin", Endpoints: []string{"127.0.0.1:1", "127.0.0.1:2"}, ConnectTimeout: "1s"}},
	}.Allocate(t)
	cfg, err := config.Parse([]byte(c.TOML()), "test")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.TOML())
	}
	if got := cfg.Listeners[0].Routes[0].DirectResponse; got == nil || got.Status != 418 || got.Body != "tea \"pot\"\n" {
		t.Errorf("direct response: %+v", got)
	}
	if cfg.Admin.Address != c.Admin || cfg.Listeners[1].Address != c.Listeners[1].Address || !strings.HasPrefix(c.Admin, "127.0.0.1:") {
		t.Errorf("addresses: %+v vs %+v", cfg, c)
	}
	p := &Proxy{Listeners: map[string]string{}}
	p.parseConfig(c.TOML())
	if p.AdminAddr != c.Admin || p.Listeners["web"] != c.Listeners[0].Address {
		t.Errorf("parseConfig: admin %q listeners %v", p.AdminAddr, p.Listeners)
	}
}

func TestCheckPattern(t *testing.T) {
	const n = 100000
	if err := CheckPattern(PatternReader(n), n); err != nil {
		t.Errorf("exact: %v", err)
	}
	if err := CheckPattern(PatternReader(n-1), n); err == nil || !strings.Contains(err.Error(), "ended early") {
		t.Errorf("short: %v", err)
	}
	if err := CheckPattern(PatternReader(n+1), n); err == nil || !strings.Contains(err.Error(), "offset 100000") {
		t.Errorf("long: %v", err)
	}
	var buf bytes.Buffer
	WritePattern(&buf, n)
	b := buf.Bytes()
	holed := append(append([]byte(nil), b[:5000]...), b[6000:]...)
	if err := CheckPattern(bytes.NewReader(holed), n); err == nil || !strings.Contains(err.Error(), "offset 5000") {
		t.Errorf("hole: %v", err)
	}
}
