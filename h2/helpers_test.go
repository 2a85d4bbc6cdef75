package h2

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
)

// answerHandler answers every request 200 with a small body, reading a
// streamed request body first.
var answerHandler = HandlerFunc(func(st *Stream) {
	if _, complete := st.Body(); !complete {
		var buf [4096]byte
		for {
			if _, err := st.Read(buf[:]); err != nil {
				break
			}
		}
	}
	st.WriteHeaders(200, []hpack.HeaderField{{Name: "content-type", Value: "text/plain"}}, false)
	st.Write([]byte("hello, h2\n"))
})

// testServer serves h2 on a loopback listener until the test ends.
type testServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []*ServerConn
	errs  []error
}

func startServer(t testing.TB, cfg *ServerConfig, h Handler, tlsConf *tls.Config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{ln: ln}
	ts.wg.Add(1)
	go func() {
		defer ts.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tlsConf != nil {
				c = tls.Server(c, tlsConf)
			}
			sc := NewServerConn(c, nil, cfg, h)
			ts.mu.Lock()
			ts.conns = append(ts.conns, sc)
			ts.mu.Unlock()
			ts.wg.Add(1)
			go func() {
				defer ts.wg.Done()
				err := sc.Serve()
				ts.mu.Lock()
				ts.errs = append(ts.errs, err)
				ts.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		ts.mu.Lock()
		for _, sc := range ts.conns {
			sc.conn.Close()
		}
		ts.mu.Unlock()
		done := make(chan struct{})
		go func() { ts.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("server connections did not end within 10s of the listener closing")
		}
	})
	return ts
}

func (ts *testServer) addr() string { return ts.ln.Addr().String() }

func selfSignedTLS(t testing.TB) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		NextProtos:   []string{"h2"},
	}
}
