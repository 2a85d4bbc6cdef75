package workers

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestH2CResponseHeadOverReusedBuffer: an HTTP/1.1 upstream's response
// head reaches an HTTP/2 client as header fields over the proxy's read
// buffer, which the next response overwrites. The engine's HPACK
// encoder keeps the strings it indexes: without its own copies, the
// corrupted table sent later responses with fields missing or wrong
// (request 6 lost its X-N-6 on main). Every response here must arrive
// with its own values.
func TestH2CResponseHeadOverReusedBuffer(t *testing.T) {
	be := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if l == "\r\n" {
					break
				}
			}
			v := fmt.Sprintf("value-%04d-%s", i, strings.Repeat("p", 40))
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-V: %s\r\nX-N-%d: %s\r\nContent-Length: 2\r\n\r\nok", v, i%7, v)
		}
	})
	m := startManager(t, proxyConfig(be, h2cListener), 1)
	c := h2cClient(t)
	for i := range 600 {
		resp, _ := h2Do(t, c, newReq(t, "GET", "http://"+addr(t, m, "web")+"/", nil))
		want := fmt.Sprintf("value-%04d-%s", i, strings.Repeat("p", 40))
		if got := resp.Header.Get("X-V"); got != want {
			t.Fatalf("request %d: X-V %q want %q", i, got, want)
		}
		if got := resp.Header.Get("X-N-" + strconv.Itoa(i%7)); got != want {
			t.Fatalf("request %d: X-N %q want %q", i, got, want)
		}
	}
}
