// Package xds is hotproxy's xDS client: one aggregated (ADS) stream to a
// control plane, state-of-the-world or delta, for listeners, routes,
// clusters, endpoints and secrets, and the mapping of those Envoy resources
// onto config's own types, the same validated objects the TOML file
// produces. The client hands a warm, complete State to the server's main
// goroutine as an Update; the main goroutine validates and publishes it,
// then calls Done, which the client turns into the ACK or NACK the xDS
// protocol asks for.
package xds

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hotproxy/hotproxy/config"
)

// Protocol is the variant of the xDS protocol the client speaks.
type Protocol string

// Protocols.
const (
	// ProtocolDelta is incremental xDS: only changed resources travel.
	ProtocolDelta Protocol = "delta"
	// ProtocolSotW is state of the world: every response carries all the
	// resources of its type the client subscribed to.
	ProtocolSotW Protocol = "sotw"
	// DefaultProtocol is what a Config with no Protocol speaks.
	DefaultProtocol = ProtocolDelta
)

// TypeURL names a resource type as the protocol does.
type TypeURL string

// The resource types the client subscribes to.
const (
	ListenerType TypeURL = "type.googleapis.com/envoy.config.listener.v3.Listener"
	RouteType    TypeURL = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	ClusterType  TypeURL = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType TypeURL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	SecretType   TypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
)

// AllTypes are the types a Config with no Types subscribes to, in the
// order the client asks for them: clusters and their endpoints before the
// listeners and routes that reference them (make before break).
var AllTypes = []TypeURL{ClusterType, EndpointType, SecretType, ListenerType, RouteType}

// Short returns the type's short name, as stats and messages use it:
// "lds", "rds", "cds", "eds", "sds".
func (t TypeURL) Short() string {
	switch t {
	case ListenerType:
		return "lds"
	case RouteType:
		return "rds"
	case ClusterType:
		return "cds"
	case EndpointType:
		return "eds"
	case SecretType:
		return "sds"
	}
	return string(t)
}

// Name returns the type as the [xds] table's resources list names it:
// "listeners", "routes", "clusters", "endpoints", "secrets".
func (t TypeURL) Name() string {
	switch t {
	case ListenerType:
		return "listeners"
	case RouteType:
		return "routes"
	case ClusterType:
		return "clusters"
	case EndpointType:
		return "endpoints"
	case SecretType:
		return "secrets"
	}
	return string(t)
}

// ParseType takes a type as [xds] resources names it ("listeners"), its
// short name ("lds") or its full type URL.
func ParseType(s string) (TypeURL, error) {
	for _, t := range AllTypes {
		if s == t.Name() || s == t.Short() || s == string(t) {
			return t, nil
		}
	}
	return "", fmt.Errorf("unknown xDS resource type %q (use listeners, routes, clusters, endpoints or secrets)", s)
}

// Defaults.
const (
	// DefaultInitialFetchTimeout is Envoy's: how long a subscribed type
	// or resource may stay unanswered before the client goes on without
	// it (a cluster with no endpoints, a listener with no routes).
	DefaultInitialFetchTimeout = 15 * time.Second
	// DefaultBackoffBase and DefaultBackoffMax bound the wait before a
	// new stream after one failed: full jitter between 0 and
	// min(max, base*2^attempt), as Envoy's default retry policy.
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
)

// Config configures a Client. Its zero value, but for Dial and NodeID, is
// the default.
type Config struct {
	// Dial opens the connection to the control plane (the static cluster
	// of the TOML file that [xds] names); DialTarget builds one.
	Dial func(ctx context.Context) (*grpc.ClientConn, error)
	// NodeID and NodeCluster identify this proxy to the control plane.
	NodeID, NodeCluster string
	// Protocol: ProtocolDelta (default) or ProtocolSotW.
	Protocol Protocol
	// InitialFetchTimeout: DefaultInitialFetchTimeout when 0.
	InitialFetchTimeout time.Duration
	// Types are the resource types subscribed; empty: AllTypes.
	Types []TypeURL
	// Initial is the state the previous generation handed over (its
	// Raw and Versions): it is the first Update, and the stream resumes
	// with its versions.
	Initial *State
	// StaticClusters are the clusters of the TOML file, which dynamic
	// routes and tcp listeners may name. An Update is held back (up to
	// InitialFetchTimeout) while a listener names a cluster that is
	// neither in it nor static, waiting for the CDS change that adds it
	// or the LDS/RDS change that stops naming it (make before break).
	// Nil: only a dynamic cluster being removed is waited on this way,
	// as any other name might be static.
	StaticClusters []string
	// SecretDir is where certificates and keys that arrive as bytes
	// (SDS, inline data sources) are written, one file per content
	// (named by its SHA-256), for config's file paths; a private
	// directory (0700, owned by this user) is made if missing. Empty: a
	// new private directory under os.TempDir(), removed when Run returns.
	SecretDir string
	// BackoffBase and BackoffMax: DefaultBackoffBase and
	// DefaultBackoffMax when 0.
	BackoffBase, BackoffMax time.Duration
	// Logger: a null logger when nil.
	Logger hclog.Logger
	// Events are told what happens, for stats.
	Events Events
}

// Events are callbacks for stats, each optional, called from the
// client's goroutine: they must not block.
type Events struct {
	// UpdateAttempt: a response of type t arrived.
	UpdateAttempt func(t TypeURL)
	// UpdateSuccess: a response of type t was accepted (ACKed).
	UpdateSuccess func(t TypeURL)
	// UpdateRejected: a response of type t was rejected (NACKed) with err.
	UpdateRejected func(t TypeURL, err error)
	// Connected: a stream to the control plane is up (true) or down.
	Connected func(up bool)
	// Version: the accepted version of type t, and its FNV-1a hash (a
	// gauge can hold the hash, not the string).
	Version func(t TypeURL, version string, hash uint64)
}

// State is every dynamic resource currently accepted, mapped onto
// config's own types (the same objects the TOML file produces, defaults
// filled in).
type State struct {
	// Listeners have their routes resolved (RDS or inline) into Routes,
	// and certificates from SDS into TLS.
	Listeners []config.Listener
	// Clusters have their endpoints from EDS resolved into Endpoints.
	Clusters []config.Cluster
	// Versions is the version_info (SotW) or system_version_info (delta)
	// last accepted per type.
	Versions map[TypeURL]string
	// ResourceVersions is, per type and resource name, the resource's
	// version (delta; SotW resources have none of their own).
	ResourceVersions map[TypeURL]map[string]string
	// Updated is when each type last changed.
	Updated map[TypeURL]time.Time
	// Raw holds the resources as serialized google.protobuf.Any, per
	// type and name: for config_dump and the hand-over. Secrets are in
	// it too: redact them before showing it.
	Raw map[TypeURL]map[string][]byte
}

// Update is a State for the server's main goroutine to validate and apply.
type Update struct {
	State *State
	ack   func(err error)
}

// Done reports the outcome: nil ACKs the responses that made this State;
// an error NACKs them with its text as error_detail (name the resource
// and the field, as `hotproxy validate` does), and the client goes on
// from the previous State. Only the first call counts.
func (u *Update) Done(err error) {
	if u.ack != nil {
		ack := u.ack
		u.ack = nil
		ack(err)
	}
}

// DialTarget returns a Config.Dial for a control plane at target
// ("127.0.0.1:18000"): plaintext when tlsConfig is nil, else TLS with it
// (its Certificates are the client certificate).
func DialTarget(target string, tlsConfig *tls.Config, opts ...grpc.DialOption) func(ctx context.Context) (*grpc.ClientConn, error) {
	return func(ctx context.Context) (*grpc.ClientConn, error) {
		creds := insecure.NewCredentials()
		if tlsConfig != nil {
			creds = credentials.NewTLS(tlsConfig)
		}
		o := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)
		conn, err := grpc.NewClient(target, o...)
		if err != nil {
			return nil, fmt.Errorf("xds: control plane %q: %w", target, err)
		}
		return conn, nil
	}
}
