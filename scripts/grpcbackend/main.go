// Command grpcbackend is scripts/bench-peers.sh's gRPC backend: a real
// grpc-go server over cleartext HTTP/2 (h2c, prior knowledge, as grpc-go
// serves without TLS) with one service, grpc.health.v1.Health, whose
// unary Check answers SERVING. The health service ships compiled in the
// grpc module, so nothing needs protoc. scripts/grpcload calls it.
//
//	grpcbackend -addr 127.0.0.1:19102
package main

import (
	"flag"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "listen `address`")
	flag.Parse()
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpcbackend: listen on %s: %v (is the port taken?)\n", *addr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	// A new health server reports SERVING for the empty service name,
	// which is what grpcload asks for.
	healthpb.RegisterHealthServer(srv, health.NewServer())
	fmt.Fprintf(os.Stderr, "grpcbackend: serving grpc.health.v1.Health on %s (h2c)\n", l.Addr())
	if err := srv.Serve(l); err != nil {
		fmt.Fprintf(os.Stderr, "grpcbackend: %v\n", err)
		os.Exit(1)
	}
}
