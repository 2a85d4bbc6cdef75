package loadgen

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// concurrencyHandler answers "ok" after holding each request until
// another is in flight (bounded), recording the most in flight at once,
// so that a test sees streams multiplexed rather than sent in turn.
type concurrencyHandler struct {
	inFlight, most atomic.Int64
	protos         sync.Map // r.Proto → true
}

func (h *concurrencyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.protos.Store(r.Proto, true)
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for h.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	w.Write([]byte("ok"))
}

func TestHTTP2MultiplexesStreams(t *testing.T) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(demoCerts, "a.example.com.pem"), filepath.Join(demoCerts, "a.example.com.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, scheme string }{{"h2", "https"}, {"h2c", "http"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := &concurrencyHandler{}
			s := httptest.NewUnstartedServer(h)
			if tc.scheme == "https" {
				s.EnableHTTP2 = true
				s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
				s.StartTLS()
			} else {
				s.Config.Protocols = new(http.Protocols)
				s.Config.Protocols.SetUnencryptedHTTP2(true)
				s.Start()
			}
			defer s.Close()
			var observed atomic.Int64
			res, err := Do(context.Background(), Options{
				URL: s.URL + "/", Mode: HTTP2, Clients: 2, Streams: 4, Requests: 80,
				TLS: demoClientTLS(t, "a.example.com"),
				Observe: func(start, end time.Time, class Class) {
					if class == ClassOK && !end.Before(start) {
						observed.Add(1)
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if res.Failed() != 0 || res.OK() != 80 {
				t.Fatalf("want 80 OK, got %v", res)
			}
			if n := observed.Load(); n != 80 {
				t.Errorf("Observe saw %d OK requests, want 80", n)
			}
			if res.Conns != 2 {
				t.Errorf("2 HTTP/2 clients dialled %d connections, want 2 (one each, streams multiplexed)", res.Conns)
			}
			if _, ok := h.protos.Load("HTTP/2.0"); !ok {
				t.Errorf("the server saw no HTTP/2 request")
			}
			if _, ok := h.protos.Load("HTTP/1.1"); ok {
				t.Errorf("the server saw an HTTP/1.1 request")
			}
			if h.most.Load() < 2 {
				t.Errorf("at most %d request in flight at once, want several (streams per client)", h.most.Load())
			}
			if tc.scheme == "https" && res.FullHandshakes+res.ResumedHandshakes != 2 {
				t.Errorf("%d TLS handshakes counted, want 2", res.FullHandshakes+res.ResumedHandshakes)
			}
		})
	}
}

// TestHTTP2CountsGoAwayAndAbruptClose: a server that ends each connection
// with a GOAWAY (Connection: close) loses no request and is counted in
// GoAways; one that closes the connection under the client's streams
// without a GOAWAY fails requests and is counted in ClosedWithoutGoAway.
func TestHTTP2CountsGoAwayAndAbruptClose(t *testing.T) {
	serve := func(t *testing.T, handler func(conn net.Conn) http.Handler) string {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		srv := &http2.Server{}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					srv.ServeConn(c, &http2.ServeConnOpts{Handler: handler(c)})
				}()
			}
		}()
		return "http://" + ln.Addr().String() + "/"
	}

	t.Run("goaway", func(t *testing.T) {
		url := serve(t, func(net.Conn) http.Handler {
			var n atomic.Int64
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if n.Add(1)%10 == 0 {
					w.Header().Set("Connection", "close") // x/net: a GOAWAY
				}
				w.Write([]byte("ok"))
			})
		})
		res, err := Do(context.Background(), Options{URL: url, Mode: HTTP2, Clients: 2, Streams: 4, Requests: 200})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if res.Failed() != 0 || res.OK() != 200 {
			t.Errorf("want 200 OK across GOAWAYs, got %v", res)
		}
		if res.GoAways == 0 || res.Conns < 2 || res.ClosedWithoutGoAway != 0 {
			t.Errorf("want GOAWAYs counted, new connections after them, none closed without one: %v", res)
		}
	})

	t.Run("abrupt", func(t *testing.T) {
		url := serve(t, func(c net.Conn) http.Handler {
			var n atomic.Int64
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if n.Add(1) == 5 {
					c.Close() // under the streams in flight, no GOAWAY
					return
				}
				w.Write([]byte("ok"))
			})
		})
		res, err := Do(context.Background(), Options{URL: url, Mode: HTTP2, Clients: 1, Streams: 4, Requests: 40, PauseAfterFailure: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if res.Failed() == 0 || res.ClosedWithoutGoAway == 0 {
			t.Errorf("want failed requests and connections counted as closed without GOAWAY: %v", res)
		}
	})
}
