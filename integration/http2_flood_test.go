package integration

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/integration/harness"
)

// TestHTTP2FloodsOverTLS (issue 20 item 7): over TLS (ALPN h2), as over
// h2c (the workers' flood tests), a connection flooding SETTINGS or PING
// frames gets a GOAWAY ENHANCE_YOUR_CALM and is closed, bounded in time,
// and the proxy goes on serving other connections.
func TestHTTP2FloodsOverTLS(t *testing.T) {
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1")
	c := startChain(t, h2ReloadConfig(demo, backend.Addr))
	addr := c.serving.Addr("h2tls")
	tc := clientTLS(t, demo.CA, "a.example.com")
	tc.NextProtos = []string{"h2"}

	for _, fl := range []struct {
		name string
		send func(fr *http2.Framer, i int) error
	}{
		{"SETTINGS", func(fr *http2.Framer, i int) error {
			return fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
		}},
		{"PING", func(fr *http2.Framer, i int) error { return fr.WritePing(false, [8]byte{byte(i)}) }},
	} {
		t.Run(fl.name, func(t *testing.T) {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: tlsTimeout}, "tcp", addr, tc)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
				t.Fatalf("ALPN %q, want h2", p)
			}
			start := time.Now()
			conn.SetDeadline(start.Add(20 * time.Second))
			// The reader: the first GOAWAY, then the connection's end.
			type result struct {
				goAway *http2.GoAwayFrame
				acks   int // SETTINGS or PING acks before the GOAWAY: frames the proxy answered
				err    error
				at     time.Time
			}
			done := make(chan result, 1)
			go func() {
				fr := http2.NewFramer(io.Discard, conn)
				var r result
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						r.err, r.at = err, time.Now()
						done <- r
						return
					}
					if ga, ok := f.(*http2.GoAwayFrame); ok && r.goAway == nil {
						r.goAway = &http2.GoAwayFrame{ErrCode: ga.ErrCode, LastStreamID: ga.LastStreamID}
					}
					if r.goAway == nil && f.Header().Flags.Has(http2.FlagSettingsAck) &&
						(f.Header().Type == http2.FrameSettings || f.Header().Type == http2.FramePing) {
						r.acks++ // FlagPingAck is the same bit
					}
				}
			}()
			bw := bufio.NewWriterSize(conn, 64<<10)
			fr := http2.NewFramer(bw, nil)
			io.WriteString(bw, http2.ClientPreface)
			fr.WriteSettings()
			sent := 0
			for sent < 200000 {
				for range 256 {
					fl.send(fr, sent)
					sent++
				}
				if bw.Flush() != nil {
					break
				}
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(15 * time.Second):
				t.Fatalf("%d %s frames over TLS: connection still open 15 s later", sent, fl.name)
			}
			t.Logf("%d %s frames sent, %d answered; connection ended %v after the flood's start (%v)", sent, fl.name, r.acks, r.at.Sub(start).Round(time.Millisecond), r.err)
			if r.goAway == nil || r.goAway.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Fatalf("GOAWAY %v before the end, want ENHANCE_YOUR_CALM", r.goAway)
			}
			// The flood is cut short: how many of its frames the proxy
			// answered, not how many the client managed to write (on
			// loopback the kernel's buffers can take all 3 MB of them
			// before the proxy's close reaches the client).
			if r.acks >= sent/2 {
				t.Errorf("%d of the %d frames answered before the GOAWAY: the flood was not cut short", r.acks, sent)
			}
		})
	}
	// Other connections are served all along.
	tr := &http2.Transport{TLSClientConfig: clientTLS(t, demo.CA, "a.example.com")}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: tlsTimeout}).Get(c.serving.HTTPSURL("h2tls", "/epoch"))
	if err != nil {
		t.Fatalf("GET /epoch after the floods: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /epoch after the floods: %s", resp.Status)
	}
}
