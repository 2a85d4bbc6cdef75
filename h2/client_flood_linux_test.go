package h2

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/net/http2"
)

// A peer that floods PING (or SETTINGS) and never reads our replies:
// the queued replies are bounded and the connection dies with
// ENHANCE_YOUR_CALM, memory bounded by the queue.
func TestClientControlFloodBounded(t *testing.T) {
	for _, kind := range []string{"ping", "settings"} {
		t.Run(kind, func(t *testing.T) {
			// Tiny socket buffers both ways (set before connect, so the
			// kernel cannot autotune them away): our replies back up after
			// a few kB instead of megabytes.
			addr, done := clientStartRawPeer(t, nil, func(ln *net.TCPListener) {
				clientSetSockBuf(t, ln, syscall.SO_RCVBUF)
				clientSetSockBuf(t, ln, syscall.SO_SNDBUF)
			}, func(p *clientRawPeer) {
				for i := 0; i < 200_000; i++ {
					var err error
					if kind == "ping" {
						err = p.fr.WritePing(false, [8]byte{byte(i)})
					} else {
						err = p.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
					}
					if err != nil {
						return // the client gave up on us: what we want
					}
				}
				t.Errorf("client took 200000 %s frames without closing", kind)
			})
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) {
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
				})
			}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			cc, err := NewClientConn(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			err = clientWaitDone(t, cc)
			if code, ok := clientConnErrCode(err); !ok || code != http2.ErrCodeEnhanceYourCalm {
				t.Fatalf("%s flood: connection ended with %v, want ENHANCE_YOUR_CALM", kind, err)
			}
			clientWaitChan(t, done, "raw peer")
		})
	}
}

func clientSetSockBuf(tb testing.TB, ln *net.TCPListener, opt int) {
	tb.Helper()
	rc, err := ln.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 4096) }); err != nil || serr != nil {
		tb.Fatalf("setsockopt: %v %v", err, serr)
	}
}
