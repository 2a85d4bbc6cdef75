package h2

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// A Shutdown before Serve has read the preface (a drain that meets a
// connection just handed to the engine) waits for the server's SETTINGS:
// they stay the first frame, the graceful GOAWAY follows, and a request
// the client sends before it answers the PING is still served.
func TestShutdownBeforeServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		sc := NewServerConn(c, nil, nil, answerHandler)
		sc.Shutdown()
		served <- sc.Serve()
	}()
	rc := dialRaw(t, ln.Addr().String())
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	first, err := rc.fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if sf, ok := first.(*http2.SettingsFrame); !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want the server's SETTINGS", first.Header())
	}
	var ping *[8]byte
	for ping == nil {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the GOAWAY and its PING: %v", err)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			if f.LastStreamID != 1<<31-1 || f.ErrCode != http2.ErrCodeNo {
				t.Fatalf("first GOAWAY: last stream %d, %v; want 2^31-1, NO_ERROR", f.LastStreamID, f.ErrCode)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				d := f.Data
				ping = &d
			}
		}
	}
	status, body, err := rc.get(1, "/between", 10*time.Second)
	if err != nil || status != "200" || string(body) != "hello, h2\n" {
		t.Fatalf("request before the PING ACK: %q %q %v", status, body, err)
	}
	rc.fr.WritePing(true, *ping)
	if res := rc.awaitGoAway(10 * time.Second); !res.sawGoAway || res.lastID != 1 || !res.closed {
		t.Fatalf("final GOAWAY %+v, want last stream 1 and the connection closed", res)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}
