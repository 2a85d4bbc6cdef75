package workers

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/config"
)

// scriptedH2 is an HTTP/2 cleartext backend on x/net's Framer that does
// what answer says with each request stream once its request ended: a
// 200 with "ok", a RST_STREAM code, or nothing (hold: the stream stays
// open). It reports the RST_STREAM frames it receives on resets.
type scriptedH2 struct {
	addr     string
	requests atomic.Int64
	resets   chan http2.ErrCode
	headers  chan []hpack.HeaderField // each request's fields, when not nil
}

func newScriptedH2(tb testing.TB, answer func(n int64) (rst http2.ErrCode, hold bool)) *scriptedH2 {
	tb.Helper()
	b := &scriptedH2{resets: make(chan http2.ErrCode, 16), headers: make(chan []hpack.HeaderField, 16)}
	b.addr = rawBackend(tb, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		pre := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, pre); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		fr.WriteSettings()
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		ended := map[uint32]bool{}
		respond := func(id uint32) {
			n := b.requests.Add(1) - 1
			rst, hold := answer(n)
			switch {
			case hold:
			case rst != 0:
				fr.WriteRSTStream(id, rst)
			default:
				hbuf.Reset()
				enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true})
				fr.WriteData(id, true, []byte("ok"))
			}
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				select {
				case b.headers <- f.Fields:
				default:
				}
				if f.StreamEnded() {
					ended[f.StreamID] = true
					respond(f.StreamID)
				}
			case *http2.DataFrame:
				if len(f.Data()) > 0 {
					fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				}
				if f.StreamEnded() && !ended[f.StreamID] {
					ended[f.StreamID] = true
					respond(f.StreamID)
				}
			case *http2.RSTStreamFrame:
				b.resets <- f.ErrCode
			}
		}
	})
	return b
}

// TestH2UpstreamRefusedStreamRetried: an HTTP/2 upstream that refuses a
// stream (REFUSED_STREAM: it never processed it, RFC 9113 §8.7) gets the
// request again, a POST too and with no retry policy, from an HTTP/2 and
// an HTTP/1.1 client alike; the client sees the second try's 200.
func TestH2UpstreamRefusedStreamRetried(t *testing.T) {
	be := newScriptedH2(t, func(n int64) (http2.ErrCode, bool) {
		if n%2 == 0 {
			return http2.ErrCodeRefusedStream, false
		}
		return 0, false
	})
	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, be.addr), 1)
	url := "http://" + addr(t, m, "web") + "/"
	resp, body := h2Do(t, h2cClient(t), newReq(t, "POST", url, strings.NewReader("payload")))
	if resp.StatusCode != 200 || body != "ok" {
		t.Errorf("HTTP/2 client: %d %q, want 200 ok", resp.StatusCode, body)
	}
	resp, err := newClient(t).Post(url, "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Errorf("HTTP/1.1 client: %d %q, want 200 ok", resp.StatusCode, b)
	}
	if n := be.requests.Load(); n != 4 {
		t.Errorf("the upstream saw %d request streams, want 4 (each request refused once)", n)
	}
}

// TestH2UpstreamClientResetCancelsUpstream: an HTTP/2 client that resets
// its stream while the upstream has not answered gets the upstream
// stream reset with CANCEL: the upstream stops working for nobody.
func TestH2UpstreamClientResetCancelsUpstream(t *testing.T) {
	be := newScriptedH2(t, func(int64) (http2.ErrCode, bool) { return 0, true })
	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, be.addr), 1)
	ctx, cancel := context.WithCancel(context.Background())
	req := newReq(t, "GET", "http://"+addr(t, m, "web")+"/slow", nil).WithContext(ctx)
	errc := make(chan error, 1)
	go func() {
		resp, err := h2cClient(t).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-be.headers:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	cancel()
	select {
	case code := <-be.resets:
		if code != http2.ErrCodeCancel {
			t.Errorf("upstream stream reset with %v, want CANCEL", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client went away and the upstream stream was never reset")
	}
	if err := <-errc; err == nil {
		t.Error("the canceled request succeeded")
	}
}

// TestH2UpstreamRequestHead: what an HTTP/2 upstream gets from an
// HTTP/1.1 client: pseudo-headers from the request line and Host,
// lower-case names, the proxy's forwarding fields, no hop-by-hop field,
// content-length from the body's framing.
func TestH2UpstreamRequestHead(t *testing.T) {
	be := newScriptedH2(t, func(int64) (http2.ErrCode, bool) { return 0, false })
	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, be.addr), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /p?q=1 HTTP/1.1\r\nHost: svc.example\r\nX-Custom: A\r\nConnection: keep-alive, X-Hop\r\nX-Hop: gone\r\nKeep-Alive: 5\r\nTE: trailers\r\nContent-Length: 3\r\n\r\nabc")
	var fields []hpack.HeaderField
	select {
	case fields = <-be.headers:
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached the upstream")
	}
	got := map[string]string{}
	for _, f := range fields {
		if f.Name != strings.ToLower(f.Name) {
			t.Errorf("field name %q is not lower case", f.Name)
		}
		got[f.Name] = f.Value
	}
	for name, want := range map[string]string{
		":method": "POST", ":path": "/p?q=1", ":authority": "svc.example", ":scheme": "http",
		"x-custom": "A", "content-length": "3", "x-forwarded-proto": "http",
		"x-forwarded-for": "127.0.0.1", "x-forwarded-host": "svc.example",
	} {
		if got[name] != want {
			t.Errorf("%s = %q, want %q", name, got[name], want)
		}
	}
	for _, name := range []string{"connection", "keep-alive", "x-hop", "host"} {
		if v, ok := got[name]; ok {
			t.Errorf("%s: %q went upstream", name, v)
		}
	}
	if len(got["x-request-id"]) == 0 {
		t.Error("no x-request-id")
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Errorf("client got %d %q", resp.StatusCode, b)
	}
}

// TestH2UpstreamMalformedClientBody: an HTTP/1.1 client whose chunked
// body turns malformed after the request went upstream gets 400 (its
// fault, not the upstream's: no 502), and the upstream stream is reset
// with CANCEL so the upstream never takes the cut body for a whole one.
func TestH2UpstreamMalformedClientBody(t *testing.T) {
	be := newScriptedH2(t, func(int64) (http2.ErrCode, bool) { return 0, false })
	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, be.addr), 1)
	c, err := net.Dial("tcp", addr(t, m, "web"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	select {
	case <-be.headers:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	io.WriteString(c, "zz-not-a-chunk-size\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	select {
	case code := <-be.resets:
		if code != http2.ErrCodeCancel {
			t.Errorf("upstream stream reset with %v, want CANCEL", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream stream was never reset")
	}
	if n := be.requests.Load(); n != 0 {
		t.Errorf("the upstream answered %d requests: it took the cut body for a whole one", n)
	}
}
