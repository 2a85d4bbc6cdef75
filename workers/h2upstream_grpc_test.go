package workers

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hotproxy/hotproxy/config"
)

// TestH2UpstreamGRPCStatus: gRPC calls from grpc-go through an h2c
// listener to a grpc-go server on an http2 cluster: a call's message and
// its grpc-status 0 trailer arrive, and an error status sent as a
// trailers-only response (a HEADERS with END_STREAM) arrives as that
// status, not as a broken stream; a server-streaming call's messages and
// end come through too.
func TestH2UpstreamGRPCStatus(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("hotproxy.test", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	m := startManager(t, h2ClusterConfig(func(*config.Route) {}, ln.Addr().String()), 1)
	conn, err := grpc.NewClient(addr(t, m, "web"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "hotproxy.test"})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call %d: %v, %v: want SERVING", i, resp, err)
		}
		_, err = client.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"})
		if code := status.Code(err); code != codes.NotFound {
			t.Fatalf("call %d for an unknown service: %v (code %v), want NotFound", i, err, code)
		}
	}
	w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "hotproxy.test"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := w.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v, %v: want SERVING", resp, err)
	}
	hs.SetServingStatus("hotproxy.test", healthpb.HealthCheckResponse_NOT_SERVING)
	if resp, err := w.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after the change: %v, %v: want NOT_SERVING (streamed through)", resp, err)
	}
}
