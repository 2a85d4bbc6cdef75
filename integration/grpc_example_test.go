package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/integration/harness"
)

// grpcFrame is one gRPC message on the wire: uncompressed flag, 4-byte
// big-endian length, the message.
func grpcFrame(msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// startGRPCBackend is a gRPC-shaped server over cleartext HTTP/2 (as
// grpc-go serves without TLS): it answers a POST of content-type
// application/grpc with the message it got, reversed, and grpc-status 0
// in the trailers; a request that is not HTTP/2 gets no trailers it could
// read (gRPC cannot work over HTTP/1.1), and a 505.
func startGRPCBackend(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Content-Type") != "application/grpc" {
			http.Error(w, "gRPC wants HTTP/2 and application/grpc", http.StatusHTTPVersionNotSupported)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
			w.Header().Set("Trailer", "Grpc-Status")
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "13")
			return
		}
		msg := body[5:]
		rev := make([]byte, len(msg))
		for i := range msg {
			rev[len(msg)-1-i] = msg[i]
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.Write(grpcFrame(rev))
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("Grpc-Message", "")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// TestExampleGRPCListener takes the example config's grpc-internal
// listener and the cluster its route names, as they are in
// examples/hotproxy.toml (only the addresses replaced), and makes a
// gRPC-shaped call through a real proxy: it must get the answer and
// grpc-status 0. The example used to route gRPC to the HTTP/1.1 cluster
// "backend": every call was a 502.
func TestExampleGRPCListener(t *testing.T) {
	t.Parallel()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	example, err := config.Load(filepath.Join(root, "examples", "hotproxy.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var lis *config.Listener
	for i := range example.Listeners {
		if example.Listeners[i].Name == "grpc-internal" {
			lis = &example.Listeners[i]
		}
	}
	if lis == nil || len(lis.Routes) == 0 {
		t.Fatal("examples/hotproxy.toml has no grpc-internal listener with routes")
	}
	var cl *config.Cluster
	for i := range example.Clusters {
		if example.Clusters[i].Name == lis.Routes[0].Cluster {
			cl = &example.Clusters[i]
		}
	}
	if cl == nil {
		t.Fatalf("grpc-internal routes to %q, which is no cluster of the example", lis.Routes[0].Cluster)
	}

	backend := startGRPCBackend(t)
	listen := harness.FreeAddr(t)
	cfg := fmt.Sprintf(`[admin]
address = %q

[[listeners]]
name = "grpc-internal"
address = %q
protocol = "http"
http2_cleartext = %v
  [[listeners.routes]]
  prefix = %q
  cluster = "grpc"

[[clusters]]
name = "grpc"
endpoints = [%q]
http2 = %v
`, harness.FreeAddr(t), listen, lis.HTTP2Cleartext, lis.Routes[0].Prefix, backend, cl.HTTP2)
	p := harness.StartProxy(t, cfg)

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Protocols: &protos}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://"+p.Addr("grpc-internal")+"/echo.Echo/Reverse", bytes.NewReader(grpcFrame([]byte("hello gRPC"))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("gRPC call through the example's grpc-internal listener: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("gRPC call through grpc-internal (routed to cluster %q, http2 = %v): %s over HTTP/%d, want 200 over HTTP/2:\n%s",
			cl.Name, cl.HTTP2, resp.Status, resp.ProtoMajor, body)
	}
	if want := grpcFrame([]byte("CPRg olleh")); !bytes.Equal(body, want) {
		t.Errorf("answer %q, want %q", body, want)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
		t.Errorf("grpc-status trailer %q, want 0 (trailers %v)", got, resp.Trailer)
	}
}
