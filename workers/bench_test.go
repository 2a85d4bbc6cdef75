package workers

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
)

// go test -run '^$' -bench . -benchmem ./workers/

func benchBackend(b *testing.B) *httptest.Server {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello, world\n")
	}))
	b.Cleanup(be.Close)
	return be
}

func benchGet(b *testing.B, url string) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(c.CloseIdleConnections)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode)
		}
	}
}

// BenchmarkHTTPDirect is the baseline: the client straight to the backend.
func BenchmarkHTTPDirect(b *testing.B) {
	benchGet(b, benchBackend(b).URL+"/")
}

// BenchmarkHTTPProxy is the same request through a Manager (one worker).
// The allocations reported include the client's and the backend's.
func BenchmarkHTTPProxy(b *testing.B) {
	be := benchBackend(b)
	m := startManager(b, proxyConfig(hostOf(be.URL)), 1)
	benchGet(b, "http://"+addr(b, m, "web")+"/")
}

// BenchmarkHTTPDirectResponse: a direct_response route, no upstream.
func BenchmarkHTTPDirectResponse(b *testing.B) {
	m := startManager(b, directConfig("hello, world\n"), 1)
	benchGet(b, "http://"+addr(b, m, "web")+"/")
}

func benchTCP(b *testing.B, addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	buf := make([]byte, 1<<20)
	rbuf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		errc := make(chan error, 1)
		go func() { _, err := c.Write(buf); errc <- err }()
		if _, err := io.ReadFull(c, rbuf); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
}

func echoServer(b *testing.B) string {
	return rawBackend(b, func(c net.Conn) { io.Copy(c, c) })
}

// BenchmarkTCPDirect: 1 MiB echoed by the backend, no proxy.
func BenchmarkTCPDirect(b *testing.B) { benchTCP(b, echoServer(b)) }

// BenchmarkTCPProxy: the same through the TCP proxy.
func BenchmarkTCPProxy(b *testing.B) {
	m := startManager(b, tcpConfig(echoServer(b), 0), 1)
	benchTCP(b, addr(b, m, "tcp"))
}

// BenchmarkRequestStats is the stats work of one proxied HTTP request in
// isolation: the listener's request counter, status class and time
// histogram, and the cluster's request counter and time histogram, on one
// worker's lane. Its cost is mostly the four clock reads (time.Now costs
// 20-80 ns depending on the machine); it allocates nothing.
func BenchmarkRequestStats(b *testing.B) {
	st, err := stats.New(stats.Options{Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	ls := newListenerStats(st, "web", 0)
	us := upstream.NewStats(st, "backend", 1)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		ls.rqTotal.Inc()
		ls.rqActive.Inc()
		us.RqTotal.Inc()
		upStart := time.Now()
		us.RqTime.Record(float64(time.Since(upStart)) / float64(time.Millisecond))
		ls.status(200)
		ls.requestDone(start)
		ls.rqActive.Dec()
	}
}
