package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestUpgradeCountedIn1xx: a WebSocket-like upgrade (101) through the
// proxy is a request (downstream_rq_total) and, like every request, in a
// response class: downstream_rq_1xx. It used to be in none, so the
// classes did not add up to the total.
func TestUpgradeCountedIn1xx(t *testing.T) {
	t.Parallel()
	be := upgradeEchoBackend(t)
	p := harness.Start(t, httpProxyConfig(be))
	region := harness.StatsPath(t)

	conn, err := net.DialTimeout("tcp", p.Addr("web"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the tunnel: %q %v", buf, err)
	}
	// And one plain request beside it.
	sendRequests(t, p, 1)

	waitCLICounter(t, region, "listener.web.downstream_rq_total", 2, 5*time.Second)
	if got := cliCounter(t, region, "listener.web.downstream_rq_1xx"); got != 1 {
		t.Errorf("downstream_rq_1xx = %d after one upgrade, want 1", got)
	}
	if got := cliCounter(t, region, "listener.web.downstream_rq_2xx"); got != 1 {
		t.Errorf("downstream_rq_2xx = %d, want 1", got)
	}
	res := statsCLI(t, 0, "--path", region, "--format", "prometheus", "--filter", `downstream_rq_1xx`)
	if !strings.Contains(res.Stdout, `hotproxy_listener_downstream_rq_1xx_total{listener="web"} 1`) {
		t.Errorf("prometheus: no 1xx counter of 1:\n%s", res.Stdout)
	}
}
