package h2

import (
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestH2loadCPUVsXNet measures CPU per request of this package's server
// and of x/net's http2.Server, the same answer (200, two fields, 10 bytes)
// on each, under h2load (16 connections x 10 streams) over loopback h2c,
// or TLS with ALPN h2 when H2LOAD_TLS=1. A measurement, not a gate: it
// runs only with H2LOAD_COMPARE=1 (H2LOAD_REQUESTS sets the load).
//
//	H2LOAD_COMPARE=1 [H2LOAD_TLS=1] go test -count=1 -v -run TestH2loadCPUVsXNet ./h2/
func TestH2loadCPUVsXNet(t *testing.T) {
	if os.Getenv("H2LOAD_COMPARE") == "" {
		t.Skip("a measurement: set H2LOAD_COMPARE=1 to run it")
	}
	bin, err := exec.LookPath("h2load")
	if err != nil {
		t.Skip("h2load not in PATH (apt-get install nghttp2-client)")
	}
	requests := 200000
	if n, err := strconv.Atoi(os.Getenv("H2LOAD_REQUESTS")); err == nil && n > 0 {
		requests = n
	}
	var tlsConf *tls.Config
	scheme := "http"
	if os.Getenv("H2LOAD_TLS") != "" {
		tlsConf, scheme = selfSignedTLS(t), "https"
	}
	ours := startServer(t, &ServerConfig{}, benchHandler, tlsConf).addr()

	xln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer xln.Close()
	xsrv := &http2.Server{}
	xh := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = []string{"text/plain"}
		w.Header()["Server"] = []string{"hotproxy"}
		w.Write(benchBody)
	})
	go func() {
		for {
			c, err := xln.Accept()
			if err != nil {
				return
			}
			if tlsConf != nil {
				tc := tls.Server(c, tlsConf)
				if tc.Handshake() != nil { // x/net's ServeConn wants it done
					tc.Close()
					continue
				}
				c = tc
			}
			go xsrv.ServeConn(c, &http2.ServeConnOpts{Handler: xh})
		}
	}()

	succeeded := regexp.MustCompile(`requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded`)
	run := func(name, addr string) float64 {
		var before, after syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &before)
		start := time.Now()
		out, err := exec.Command(bin, "-c16", "-m10", "-t1", "-n", strconv.Itoa(requests), scheme+"://"+addr+"/bench").CombinedOutput()
		wall := time.Since(start)
		syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		m := succeeded.FindSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("h2load against %s: %v\n%s", name, err, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		if n != requests {
			t.Errorf("%s: %d of %d requests succeeded", name, n, requests)
		}
		cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
		perReq := float64(cpu.Microseconds()) / float64(n)
		t.Logf("%-6s %d requests in %v (%.0f req/s): server CPU %v, %.2f µs/request", name, n, wall.Round(time.Millisecond), float64(n)/wall.Seconds(), cpu.Round(time.Millisecond), perReq)
		return perReq
	}
	var oursSum, xnetSum float64
	for round := 0; round < 3; round++ {
		oursSum += run("h2", ours)
		xnetSum += run("x/net", xln.Addr().String())
	}
	t.Logf("mean over 3 interleaved rounds: h2 %.2f µs/request, x/net %.2f µs/request (ratio %.2f)", oursSum/3, xnetSum/3, oursSum/xnetSum)
}
