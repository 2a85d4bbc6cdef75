package config

import (
	"slices"
	"time"
)

// xDS protocol variants ([xds] protocol).
const (
	// XDSProtocolDelta is incremental xDS: the control plane sends what
	// changed, and the proxy says which resources it has.
	XDSProtocolDelta = "delta"
	// XDSProtocolSotW is state of the world: every response carries every
	// resource of its type.
	XDSProtocolSotW = "sotw"
)

// xDS resource types a proxy may subscribe to ([xds] resources).
const (
	XDSListeners = "listeners" // LDS
	XDSRoutes    = "routes"    // RDS
	XDSClusters  = "clusters"  // CDS
	XDSEndpoints = "endpoints" // EDS
	XDSSecrets   = "secrets"   // SDS
)

// XDSResourceTypes are the resource types, in the order a subscription
// starts them (clusters before listeners: make before break).
var XDSResourceTypes = []string{XDSClusters, XDSEndpoints, XDSListeners, XDSRoutes, XDSSecrets}

// DefaultInitialFetchTimeout is Envoy's: how long a generation waits for
// the first answer of the control plane before it serves without it.
const DefaultInitialFetchTimeout = 15 * time.Second

// XDS is the [xds] table: where dynamic listeners, routes, clusters,
// endpoints and secrets come from. Off unless Cluster is set. Dynamic
// resources add to the file's own (static) ones; a name in both is an
// error.
type XDS struct {
	// Cluster names the static cluster (a [[clusters]] of this file) of
	// the control plane; its endpoints are the ADS servers and its
	// [clusters.tls] the TLS to them (a client certificate included).
	Cluster string `toml:"cluster,omitempty" json:"cluster,omitempty"`
	// NodeID and NodeCluster are the node's id and cluster as the
	// control plane sees them (Envoy's --service-node and
	// --service-cluster). Empty: the host name and "hotproxy".
	NodeID      string `toml:"node_id,omitempty" json:"node_id,omitempty"`
	NodeCluster string `toml:"node_cluster,omitempty" json:"node_cluster,omitempty"`
	// Protocol is "delta" (incremental) or "sotw" (state of the world).
	Protocol string `toml:"protocol" json:"protocol" default:"delta"`
	// InitialFetchTimeout bounds the wait for the control plane's first
	// answer at start; past it the generation serves what it has.
	InitialFetchTimeout Duration `toml:"initial_fetch_timeout" json:"initial_fetch_timeout" default:"15s" bound:"100ms..1h"`
	// Resources are the types subscribed to.
	Resources []string `toml:"resources" json:"resources" default:"listeners,routes,clusters,endpoints,secrets"`
}

// Enabled reports whether the [xds] table turns dynamic configuration on.
func (x XDS) Enabled() bool { return x.Cluster != "" }

// Subscribes reports whether the resource type typ (XDSListeners...) is
// subscribed to.
func (x XDS) Subscribes(typ string) bool { return slices.Contains(x.Resources, typ) }

func (v *validator) xds() {
	x := v.c.XDS
	if !slices.Contains([]string{XDSProtocolDelta, XDSProtocolSotW}, x.Protocol) {
		v.ps.add("xds.protocol", "%s: unknown protocol (use %s)", quote(x.Protocol), orList([]string{XDSProtocolDelta, XDSProtocolSotW}))
	}
	seen := map[string]bool{}
	for _, r := range x.Resources {
		switch {
		case !slices.Contains(XDSResourceTypes, r):
			v.ps.add("xds.resources", "%s: unknown resource type (use %s)", quote(r), orList(XDSResourceTypes))
		case seen[r]:
			v.ps.add("xds.resources", "%s: listed twice", quote(r))
		}
		seen[r] = true
	}
	if !x.Enabled() {
		if x.NodeID != "" || x.NodeCluster != "" {
			v.ps.add("xds.cluster", "missing: [xds] sets node_id or node_cluster but names no control plane; set cluster to the name of a [[clusters]] whose endpoints are the ADS servers, or remove the [xds] table")
		}
		return
	}
	if v.c.Cluster(x.Cluster) == nil {
		names := make([]string, 0, len(v.c.Clusters))
		for _, c := range v.c.Clusters {
			names = append(names, quote(c.Name))
		}
		hint := "this file defines none; add a [[clusters]] whose endpoints are the ADS servers"
		if len(names) > 0 {
			hint = "it must be a static cluster of this file: " + orList(names)
		}
		v.ps.add("xds.cluster", "%s: no such cluster (%s)", quote(x.Cluster), hint)
	}
}
