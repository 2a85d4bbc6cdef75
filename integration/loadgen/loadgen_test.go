package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawServer serves raw TCP on loopback; serve is called once per request
// read from a connection, with the request's index on that connection, and
// returns false to stop serving the connection (closing it normally, unless
// serve closed it itself).
func rawServer(t *testing.T, serve func(c net.Conn, req *http.Request, n int) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !serve(c, req, n) {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}

func writeOK(c net.Conn, extra string) {
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n%s\r\nok", extra)
}

func reset(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

func run(t *testing.T, opts Options) Result {
	t.Helper()
	if opts.Duration == 0 {
		opts.Duration = 10 * time.Second
	}
	res, err := Do(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	return res
}

func TestKeepAliveReusesConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	res := run(t, Options{URL: srv.URL, Clients: 4, Requests: 400})
	if res.Total() != 400 || res.OK() != 400 || res.Failed() != 0 {
		t.Fatalf("want 400 ok, got %v", res)
	}
	if res.Conns > 4 {
		t.Errorf("keep-alive dialled %d connections for 4 clients", res.Conns)
	}
}

func TestConnPerRequestDialsEveryTime(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	res := run(t, Options{URL: srv.URL, Clients: 4, Requests: 200, Mode: ConnPerRequest})
	if res.OK() != 200 || res.Failed() != 0 {
		t.Fatalf("want 200 ok, got %v", res)
	}
	if res.Conns != 200 {
		t.Errorf("conn-per-request dialled %d connections for 200 requests", res.Conns)
	}
}

func TestConnectionCloseIsNotAnError(t *testing.T) {
	url := rawServer(t, func(c net.Conn, _ *http.Request, n int) bool {
		if n%3 == 2 {
			writeOK(c, "Connection: close\r\n")
			return false
		}
		writeOK(c, "")
		return true
	})
	res := run(t, Options{URL: url, Clients: 4, Requests: 300})
	if res.OK() != 300 || res.Failed() != 0 || res.Retried != 0 {
		t.Fatalf("want 300 ok, got %v", res)
	}
	if res.Conns < 100 {
		t.Errorf("Connection: close every third request: want >= 100 connections, got %d", res.Conns)
	}
}

func TestDurationBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	start := time.Now()
	res, err := Do(context.Background(), Options{URL: srv.URL, Clients: 2, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("200ms run took %v", el)
	}
	if res.OK() == 0 || res.Failed() != 0 {
		t.Errorf("got %v", res)
	}
}

func TestFailureClasses(t *testing.T) {
	closed := func() string {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
		return "http://" + ln.Addr().String() + "/"
	}
	tests := []struct {
		name   string
		url    func(t *testing.T) string
		class  Class
		status int
	}{
		{"refused", func(t *testing.T) string { return closed() }, ClassRefused, 0},
		{"reset before response", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool { reset(c); return false })
		}, ClassReset, 0},
		{"eof before response", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool { return false })
		}, ClassEOF, 0},
		{"truncated body", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort")
				return false
			})
		}, ClassTruncated, 0},
		{"reset mid body", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort")
				time.Sleep(20 * time.Millisecond)
				reset(c)
				return false
			})
		}, ClassReset, 0},
		{"status", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool {
				io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
				return true
			})
		}, ClassStatus, 503},
		{"timeout", func(t *testing.T) string {
			return rawServer(t, func(c net.Conn, _ *http.Request, _ int) bool {
				time.Sleep(300 * time.Millisecond)
				return false
			})
		}, ClassTimeout, 0},
	}
	for _, tt := range tests {
		for _, mode := range []Mode{KeepAlive, ConnPerRequest} {
			t.Run(tt.name+"/"+mode.String(), func(t *testing.T) {
				res := run(t, Options{
					URL: tt.url(t), Mode: mode, Clients: 2, Requests: 10,
					Timeout: 100 * time.Millisecond, PauseAfterFailure: -1,
				})
				if res.Total() != 10 || res.Count(tt.class) != 10 || res.Failed() != 10 {
					t.Fatalf("want 10 × %v, got %v", tt.class, res)
				}
				if tt.status != 0 && res.Statuses[tt.status] != 10 {
					t.Errorf("want statuses{%d:10}, got %v", tt.status, res.Statuses)
				}
				if res.Retried != 0 {
					t.Errorf("fresh connections must not be retried, got %d", res.Retried)
				}
			})
		}
	}
}

// A keep-alive connection that the server closes after reading the next
// request, without answering: net/http retries the GET on a new connection
// and would report success. loadgen must count it.
func TestTransportRetryIsCounted(t *testing.T) {
	url := rawServer(t, func(c net.Conn, _ *http.Request, n int) bool {
		if n == 0 {
			writeOK(c, "")
			return true
		}
		return false // close without a response
	})
	opts := Options{URL: url, Clients: 1, Requests: 20, PauseAfterFailure: -1}
	res := run(t, opts)
	// Every request after the first on a connection is retried on a new
	// one, whose first request succeeds.
	if res.OK() != 20 {
		t.Fatalf("want 20 ok after retries, got %v", res)
	}
	if res.Retried < 10 {
		t.Fatalf("want >= 10 retried, got %v", res)
	}
	if res.Failed() != res.Retried {
		t.Errorf("retries must count as failures: Failed()=%d Retried=%d", res.Failed(), res.Retried)
	}
	opts.TolerateRetries = true
	res = run(t, opts)
	if res.Retried < 10 || res.Failed() != 0 {
		t.Errorf("TolerateRetries: want retried>=10 failed=0, got %v", res)
	}
}

// A POST with a body is not replayable: the same server gives an honest
// EOF instead of a hidden retry.
func TestPostIsNotRetried(t *testing.T) {
	url := rawServer(t, func(c net.Conn, _ *http.Request, n int) bool {
		if n == 0 {
			writeOK(c, "")
			return true
		}
		return false
	})
	res := run(t, Options{URL: url, Method: http.MethodPost, Body: []byte("x"), Clients: 1, Requests: 20, PauseAfterFailure: -1})
	if res.Retried != 0 || res.Count(ClassEOF) != 10 || res.OK() != 10 {
		t.Fatalf("want 10 ok and 10 eof, no retries; got %v", res)
	}
}

func TestCheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "nope") }))
	defer srv.Close()
	res := run(t, Options{URL: srv.URL, Requests: 5, Check: func(_ *http.Response, b []byte) error {
		if string(b) != "ok" {
			return errors.New("body " + string(b))
		}
		return nil
	}})
	if res.Count(ClassBadBody) != 5 || !strings.Contains(res.String(), "body nope") {
		t.Fatalf("got %v", res)
	}
}

func TestStopAndSnapshot(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	r, err := Start(context.Background(), Options{URL: srv.URL, Clients: 2, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !r.WaitTotal(50, 10*time.Second) {
		t.Fatalf("50 requests not reached: %v", r.Snapshot())
	}
	start := time.Now()
	res := r.Stop()
	if time.Since(start) > 5*time.Second {
		t.Errorf("Stop took %v", time.Since(start))
	}
	if res.Failed() != 0 || res.OK() < 50 {
		t.Errorf("got %v", res)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	if _, err := Start(context.Background(), Options{}); err == nil {
		t.Error("no URL: want an error")
	}
	if _, err := Start(context.Background(), Options{URL: "http://x/", Method: "BAD METHOD"}); err == nil {
		t.Error("bad method: want an error")
	}
}
