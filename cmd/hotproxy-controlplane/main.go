// Command hotproxy-controlplane is a demo xDS control plane: it serves the
// resources of one JSON file to every proxy that connects (ADS, state of
// the world and delta alike), on go-control-plane's snapshot cache and
// server, and serves the file again whenever it changes.
//
// The file lists Envoy resources in Envoy's own JSON (protojson), by kind:
//
//	{
//	  "version": "1",                      (optional; default: a hash of the file)
//	  "listeners": [ {Listener}, ... ],
//	  "routes":    [ {RouteConfiguration}, ... ],
//	  "clusters":  [ {Cluster}, ... ],
//	  "endpoints": [ {ClusterLoadAssignment}, ... ],
//	  "secrets":   [ {Secret}, ... ]
//	}
//
// See docs/xds.md for an example and for what hotproxy maps.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	// The extension types a typed_config may hold, for protojson.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// allNodes gives every proxy the same snapshot, whatever its node id.
type allNodes struct{}

func (allNodes) ID(*corev3.Node) string { return "all" }

func main() {
	addr := flag.String("listen", "127.0.0.1:18000", "address the gRPC server listens on (plaintext)")
	file := flag.String("file", "", "the JSON file of resources to serve (required)")
	poll := flag.Duration("poll", time.Second, "how often the file's modification time is checked (100ms to 1m)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: hotproxy-controlplane -file SNAPSHOT.json [-listen ADDR] [-poll DURATION]\n\n"+
			"A demo xDS control plane: serves the Envoy resources of SNAPSHOT.json over ADS (SotW and delta)\n"+
			"to every proxy, and serves the file again when it changes. Its schema: docs/xds.md.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *file == "" {
		fmt.Fprintln(os.Stderr, "hotproxy-controlplane: -file is required: the JSON file of resources to serve (see docs/xds.md)")
		os.Exit(2)
	}
	if *poll < 100*time.Millisecond || *poll > time.Minute {
		fmt.Fprintf(os.Stderr, "hotproxy-controlplane: -poll %s: must be between 100ms and 1m\n", *poll)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *file, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "hotproxy-controlplane:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, file string, poll time.Duration) error {
	cache := cachev3.NewSnapshotCache(true, allNodes{}, nil)
	snap, err := LoadSnapshot(file)
	if err != nil {
		return err
	}
	if err := cache.SetSnapshot(ctx, "all", snap); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, cache, nil))
	go func() {
		<-ctx.Done()
		gs.GracefulStop()
	}()
	go watch(ctx, cache, file, poll)
	log.Printf("serving %s (version %s) on %s", file, snap.GetVersion(resourcev3.ClusterType), lis.Addr())
	return gs.Serve(lis)
}

// watch serves the file again when its modification time or size
// changes; a file that does not load keeps the last good snapshot.
func watch(ctx context.Context, cache cachev3.SnapshotCache, file string, poll time.Duration) {
	last, _ := os.Stat(file)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(file)
		if err != nil || (last != nil && fi.ModTime().Equal(last.ModTime()) && fi.Size() == last.Size()) {
			continue
		}
		last = fi
		snap, err := LoadSnapshot(file)
		if err == nil {
			err = cache.SetSnapshot(ctx, "all", snap)
		}
		if err != nil {
			log.Printf("%s: %v (still serving the last good version)", file, err)
			continue
		}
		log.Printf("%s changed: serving version %s", file, snap.GetVersion(resourcev3.ClusterType))
	}
}

// snapshotFile is the file's schema.
type snapshotFile struct {
	Version   string            `json:"version"`
	Listeners []json.RawMessage `json:"listeners"`
	Routes    []json.RawMessage `json:"routes"`
	Clusters  []json.RawMessage `json:"clusters"`
	Endpoints []json.RawMessage `json:"endpoints"`
	Secrets   []json.RawMessage `json:"secrets"`
}

// LoadSnapshot reads a snapshot file; unknown keys are errors, so that a
// typo is not silently an empty list.
func LoadSnapshot(file string) (*cachev3.Snapshot, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var f snapshotFile
	dec := json.NewDecoder(bytesReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w (keys: version, listeners, routes, clusters, endpoints, secrets)", file, err)
	}
	if f.Version == "" {
		sum := sha256.Sum256(data)
		f.Version = hex.EncodeToString(sum[:6])
	}
	res := map[resourcev3.Type][]types.Resource{}
	kinds := []struct {
		key   string
		typ   resourcev3.Type
		items []json.RawMessage
		new   func() proto.Message
	}{
		{"listeners", resourcev3.ListenerType, f.Listeners, func() proto.Message { return &listenerv3.Listener{} }},
		{"routes", resourcev3.RouteType, f.Routes, func() proto.Message { return &routev3.RouteConfiguration{} }},
		{"clusters", resourcev3.ClusterType, f.Clusters, func() proto.Message { return &clusterv3.Cluster{} }},
		{"endpoints", resourcev3.EndpointType, f.Endpoints, func() proto.Message { return &endpointv3.ClusterLoadAssignment{} }},
		{"secrets", resourcev3.SecretType, f.Secrets, func() proto.Message { return &tlsv3.Secret{} }},
	}
	for _, k := range kinds {
		for i, raw := range k.items {
			m := k.new()
			if err := protojson.Unmarshal(raw, m); err != nil {
				return nil, fmt.Errorf("%s: %s[%d]: %w", file, k.key, i, err)
			}
			res[k.typ] = append(res[k.typ], m)
		}
	}
	snap, err := cachev3.NewSnapshot(f.Version, res)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := snap.Consistent(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("%s: %w (every cluster's endpoints and every listener's routes must be in the file)", file, err)
	}
	return snap, nil
}
