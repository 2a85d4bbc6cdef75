package tcp

import (
	"net"
	"testing"
	"time"
)

func TestReadClientHelloBounded(t *testing.T) {
	srv, cli := tcpPair(t)
	// A ClientHello announced as 60000 bytes (crypto/tls takes up to
	// 64 KiB), in 16 KiB records: the reader stops at its bound.
	go func() {
		for i := range 4 {
			rec := make([]byte, 5+16<<10)
			copy(rec, []byte{0x16, 0x03, 0x01, 0x40, 0x00})
			if i == 0 {
				copy(rec[5:], []byte{0x01, 0x00, 0xea, 0x60, 0x03, 0x03})
			}
			if _, err := cli.Write(rec); err != nil {
				return
			}
		}
	}()
	sni, hello, err := readClientHello(srv, 5*time.Second)
	if sni != "" || err != errHelloTooLarge || len(hello) != maxClientHello {
		t.Fatalf("sni %q, %d bytes, err %v: want no SNI, %d bytes, %v", sni, len(hello), err, maxClientHello, errHelloTooLarge)
	}
}

// tcpPair is a connected pair of loopback TCP sockets.
func tcpPair(tb testing.TB) (server, client *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}
