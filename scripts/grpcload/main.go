// Command grpcload is scripts/bench-peers.sh's load for the grpc mode:
// unary gRPC calls (grpc.health.v1.Health/Check, compiled in the grpc
// module) from -c client connections, each carrying -m calls at once, for
// -d, over cleartext HTTP/2 (h2c) to -addr: a proxy's h2c listener, or
// scripts/grpcbackend itself. Every connection is its own grpc.ClientConn,
// so the proxy sees -c HTTP/2 connections of -m concurrent streams.
//
// It prints one line of key=value figures: calls (finished in the
// measured time), ok (status OK and SERVING), failed (any other status or
// answer), seconds, calls_per_s, mean_ms and p99_ms of the calls that were
// ok, and the first error seen, if any. It exits 1 when no call succeeded.
//
//	grpcload -addr 127.0.0.1:19113 -c 16 -m 10 -d 8s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// maxSamples bounds the latencies each caller keeps for the p99: enough
// for a steady figure, bounded memory however long the run.
const maxSamples = 1 << 14

func main() {
	addr := flag.String("addr", "", "h2c `address` to call (host:port)")
	conns := flag.Int("c", 16, "client connections")
	streams := flag.Int("m", 10, "concurrent calls per connection")
	duration := flag.Duration("d", 10*time.Second, "how long to run")
	callTimeout := flag.Duration("timeout", 5*time.Second, "deadline of each call")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "grpcload: -addr is required (the proxy's h2c listener, host:port)")
		os.Exit(2)
	}
	if *conns < 1 || *streams < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "grpcload: -c and -m must be at least 1, -d positive")
		os.Exit(2)
	}

	clients := make([]healthpb.HealthClient, *conns)
	for i := range clients {
		// passthrough: the address as given, no DNS; :authority is it.
		cc, err := grpc.NewClient("passthrough:///"+*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintf(os.Stderr, "grpcload: client for %s: %v\n", *addr, err)
			os.Exit(1)
		}
		defer cc.Close()
		clients[i] = healthpb.NewHealthClient(cc)
	}

	var (
		ok, failed atomic.Int64
		firstErr   atomic.Value // string
		wg         sync.WaitGroup
		mu         sync.Mutex // guards latencies
		latencies  []time.Duration
	)
	start := time.Now()
	deadline := start.Add(*duration)
	for _, client := range clients {
		for range *streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				samples := make([]time.Duration, 0, 1024)
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), *callTimeout)
					t0 := time.Now()
					resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
					took := time.Since(t0)
					cancel()
					switch {
					case err != nil:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, "answer "+resp.GetStatus().String()+", not SERVING")
					default:
						ok.Add(1)
						if len(samples) < maxSamples {
							samples = append(samples, took)
						}
					}
				}
				mu.Lock()
				latencies = append(latencies, samples...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	n := ok.Load() + failed.Load()
	var mean, p99 float64
	if len(latencies) > 0 {
		slices.Sort(latencies)
		var sum time.Duration
		for _, l := range latencies {
			sum += l
		}
		mean = float64(sum) / float64(len(latencies)) / 1e6
		p99 = float64(latencies[len(latencies)*99/100]) / 1e6
	}
	line := fmt.Sprintf("calls=%d ok=%d failed=%d seconds=%.3f calls_per_s=%.2f mean_ms=%.3f p99_ms=%.3f",
		n, ok.Load(), failed.Load(), secs, float64(n)/secs, mean, p99)
	if e, _ := firstErr.Load().(string); e != "" {
		line += fmt.Sprintf(" first_error=%q", e)
	}
	fmt.Println(line)
	if ok.Load() == 0 {
		os.Exit(1)
	}
}
