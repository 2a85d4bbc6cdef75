package h2

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// writeCountingConn counts the writes the server makes to its socket.
type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestResponsesReadyTogetherShareAWrite: responses whose handlers become
// runnable at the same moment (as a proxy's do when the poller reports
// several upstream answers at once) leave in one socket write, not one
// each. On one P (GOMAXPROCS=1, as the benchmarks pin a worker), a woken
// writer used to run as soon as the first handler parked and wrote that
// response alone: a write(2), and over TLS a record, per response.
func TestResponsesReadyTogetherShareAWrite(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const streams = 20
	var (
		writes  atomic.Int64
		started sync.WaitGroup
		release = make(chan struct{})
	)
	started.Add(streams)
	h := HandlerFunc(func(st *Stream) {
		started.Done()
		<-release
		st.WriteHeaders(200, []hpack.HeaderField{{Name: "content-type", Value: "text/plain"}}, false)
		st.Write([]byte("hello, h2\n"))
	})
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
		served <- NewServerConn(writeCountingConn{c, &writes}, nil, nil, h).Serve()
	}()

	rc := dialRaw(t, ln.Addr().String())
	for i := range streams {
		if err := rc.headers(uint32(2*i+1), rc.block("GET", "/"), true); err != nil {
			t.Fatal(err)
		}
	}
	handlersIn := make(chan struct{})
	go func() { started.Wait(); close(handlersIn) }()
	select {
	case <-handlersIn:
	case <-time.After(10 * time.Second):
		t.Fatalf("the %d handlers did not all start within 10s", streams)
	}
	before := writes.Load()
	close(release)

	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	ended := map[uint32]bool{}
	for len(ended) < streams {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading responses (%d of %d complete): %v", len(ended), streams, err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if _, err := rc.dec().Write(f.HeaderBlockFragment()); err != nil {
				t.Fatal(err)
			}
			if rc.lastStatus != "200" {
				t.Fatalf("stream %d: status %q, want 200", f.StreamID, rc.lastStatus)
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				ended[f.StreamID] = true
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.SettingsFrame:
			if !f.IsAck() {
				rc.fr.WriteSettingsAck()
			}
		}
	}
	got := writes.Load() - before
	// Before the change: one write per response (20).
	if got > streams/4 {
		t.Errorf("%d responses ready together took %d socket writes (want at most %d): the writer no longer lets them coalesce", streams, got, streams/4)
	}
	t.Logf("%d responses ready together: %d socket writes", streams, got)
	rc.c.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Errorf("Serve did not return within 10s of the client closing")
	}
}
