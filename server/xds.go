package server

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
)

// XDSEvents is what the xDS client reports to the generation, from its own
// goroutine: each response it weighed, its outcome, and the stream's state.
// typ is a resource type, by its config name (config.XDSListeners...) or
// its type URL ("type.googleapis.com/envoy.config.listener.v3.Listener").
// The server counts them in its stats (Server.XDSEvents).
type XDSEvents interface {
	// UpdateAttempt: a response of type typ arrived and is being weighed.
	UpdateAttempt(typ string)
	// UpdateSuccess: it was accepted (ACK) at version.
	UpdateSuccess(typ, version string)
	// UpdateRejected: it was refused (NACK) with err.
	UpdateRejected(typ string, err error)
	// Connected: the stream to the control plane is up (true) or down.
	Connected(bool)
}

// xDS stats, on the main lane (0); the gauges are GaugeNewest (the serving
// generation's value, not a sum over generations):
//
//	xds.<type>.update_attempt   counter: responses of the type weighed
//	xds.<type>.update_success   counter: accepted (ACK)
//	xds.<type>.update_rejected  counter: refused (NACK)
//	xds.<type>.version_hash     gauge: the accepted version, hashed (FNV-1a,
//	                            53 bits: exact in a float64); 0: none yet
//	xds.connected               gauge: 1 while the stream is up
//
// <type> is listeners, routes, clusters, endpoints or secrets; registered
// for the types [xds] resources subscribes to, when [xds] is on.
type xdsStats struct {
	log       hclog.Logger
	types     map[string]*xdsTypeStats
	connected stats.GaugeLane
}

type xdsTypeStats struct {
	attempt, success, rejected stats.CounterLane
	versionHash                stats.GaugeLane
}

var _ XDSEvents = (*xdsStats)(nil)

// xdsTypeURLs maps the xDS v3 type URLs to config's type names.
var xdsTypeURLs = map[string]string{
	"type.googleapis.com/envoy.config.listener.v3.Listener":                config.XDSListeners,
	"type.googleapis.com/envoy.config.route.v3.RouteConfiguration":         config.XDSRoutes,
	"type.googleapis.com/envoy.config.cluster.v3.Cluster":                  config.XDSClusters,
	"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment":   config.XDSEndpoints,
	"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret": config.XDSSecrets,
}

// xdsTypeName is typ by config's name, or "" for a type hotproxy does not
// subscribe to.
func xdsTypeName(typ string) string {
	if n, ok := xdsTypeURLs[typ]; ok {
		return n
	}
	if slices.Contains(config.XDSResourceTypes, typ) {
		return typ
	}
	return ""
}

// newXDSStats registers the xDS stats of x in st; nil when [xds] is off.
func newXDSStats(x config.XDS, st *stats.Store, log hclog.Logger) *xdsStats {
	if !x.Enabled() || st == nil {
		return nil
	}
	xs := &xdsStats{
		log:       log.Named("xds"),
		types:     map[string]*xdsTypeStats{},
		connected: st.Gauge("xds.connected", stats.GaugeNewest).Lane(0),
	}
	for _, typ := range config.XDSResourceTypes {
		if !x.Subscribes(typ) {
			continue
		}
		p := "xds." + typ + "."
		xs.types[typ] = &xdsTypeStats{
			attempt:     st.Counter(p + "update_attempt").Lane(0),
			success:     st.Counter(p + "update_success").Lane(0),
			rejected:    st.Counter(p + "update_rejected").Lane(0),
			versionHash: st.Gauge(p+"version_hash", stats.GaugeNewest).Lane(0),
		}
	}
	return xs
}

func (xs *xdsStats) of(typ string) *xdsTypeStats {
	if xs == nil {
		return nil
	}
	return xs.types[xdsTypeName(typ)]
}

func (xs *xdsStats) UpdateAttempt(typ string) {
	if t := xs.of(typ); t != nil {
		t.attempt.Inc()
	}
}

func (xs *xdsStats) UpdateSuccess(typ, version string) {
	if t := xs.of(typ); t != nil {
		t.success.Inc()
		t.versionHash.Set(versionHash(version))
	}
}

// setVersion shows version as typ's accepted one, counting nothing: the
// versions a generation was handed over.
func (xs *xdsStats) setVersion(typ, version string) {
	if t := xs.of(typ); t != nil {
		t.versionHash.Set(versionHash(version))
	}
}

func (xs *xdsStats) UpdateRejected(typ string, err error) {
	t := xs.of(typ)
	if t == nil {
		return
	}
	t.rejected.Inc()
	if err != nil {
		xs.log.Warn("update refused (NACK)", "type", typ, "error", err)
	}
}

func (xs *xdsStats) Connected(up bool) {
	if xs == nil {
		return
	}
	xs.connected.Set(boolGauge(up))
}

// versionHash is version as xds.<type>.version_hash shows it.
func versionHash(version string) int64 {
	if version == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(version))
	return int64(h.Sum64() >> 11)
}

// XDSEvents is where the xDS client reports to this generation (counted in
// the xds.* stats). Without [xds] it counts nothing.
func (s *Server) XDSEvents() XDSEvents {
	if s.xds == nil {
		return nopXDSEvents{}
	}
	return s.xds
}

// XDSControlPlane is the static cluster [xds] cluster names, as built:
// its Endpoints are the ADS servers' addresses (resolved) and ClientTLS(i)
// the TLS to endpoint i ([clusters.tls], a client certificate included,
// ALPN h2 with http2 = true; nil: plaintext), so that the xDS client dials
// the control plane exactly as the proxy would. nil without [xds].
func (s *Server) XDSControlPlane() *upstream.Cluster {
	if !s.cfg.XDS.Enabled() {
		return nil
	}
	for _, c := range s.snapshot.Load().Clusters() {
		if c.Name == s.cfg.XDS.Cluster {
			return c
		}
	}
	return nil
}

type nopXDSEvents struct{}

func (nopXDSEvents) UpdateAttempt(string)         {}
func (nopXDSEvents) UpdateSuccess(string, string) {}
func (nopXDSEvents) UpdateRejected(string, error) {}
func (nopXDSEvents) Connected(bool)               {}

// ConfigDump is GET /config_dump: the effective configuration (the file's
// and the dynamic resources together, defaults filled in, as the workers
// serve it), then the same split into the file's (static) and the control
// plane's (dynamic) resources with their versions and update times. Key
// material never appears: TLS key files and session-ticket key files are
// redacted, and the resources as the control plane sent them are shown by
// name, size and digest only (a secret's not even by digest).
type ConfigDump struct {
	config.Config
	StaticResources  ConfigDumpStatic   `json:"static_resources"`
	DynamicResources *ConfigDumpDynamic `json:"dynamic_resources"`
}

// ConfigDumpStatic are the file's resources.
type ConfigDumpStatic struct {
	Listeners []config.Listener `json:"listeners"`
	Clusters  []config.Cluster  `json:"clusters"`
}

// ConfigDumpDynamic are the control plane's resources serving now; nil
// (null) when none was applied.
type ConfigDumpDynamic struct {
	Listeners []config.Listener `json:"listeners"`
	Clusters  []config.Cluster  `json:"clusters"`
	// Versions and LastUpdated are by resource type.
	Versions    map[string]string `json:"versions"`
	LastUpdated map[string]string `json:"last_updated"`
	// Applied is when this generation applied the set.
	Applied string `json:"applied"`
	// Resources are the resources as sent, by type, sorted by name.
	Resources map[string][]ConfigDumpRaw `json:"resources,omitempty"`
}

// ConfigDumpRaw is one resource as the control plane sent it, described.
type ConfigDumpRaw struct {
	Name   string `json:"name"`
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256,omitempty"`
}

// redacted replaces key material in config_dump.
const redacted = "[redacted]"

func (s *Server) handleConfigDump(w http.ResponseWriter, _ *http.Request) {
	static := s.cfg
	dump := ConfigDump{StaticResources: ConfigDumpStatic{
		Listeners: redactListeners(static.Listeners),
		Clusters:  redactClusters(static.Clusters),
	}}
	effective := *static
	effective.Listeners = slices.Clone(static.Listeners)
	effective.Clusters = slices.Clone(static.Clusters)
	if v := s.dyn.view.Load(); v != nil {
		d := &ConfigDumpDynamic{
			Listeners:   redactListeners(v.set.Listeners),
			Clusters:    redactClusters(v.set.Clusters),
			Versions:    v.set.Versions,
			LastUpdated: map[string]string{},
			Applied:     v.applied.UTC().Format(time.RFC3339Nano),
			Resources:   map[string][]ConfigDumpRaw{},
		}
		for typ, at := range v.set.Updated {
			d.LastUpdated[typ] = at.UTC().Format(time.RFC3339Nano)
		}
		for typ, byName := range v.set.Raw {
			secret := xdsTypeName(typ) == config.XDSSecrets
			for name, b := range byName {
				r := ConfigDumpRaw{Name: name, Bytes: len(b)}
				if !secret {
					sum := sha256.Sum256(b)
					r.SHA256 = hex.EncodeToString(sum[:])
				}
				d.Resources[typ] = append(d.Resources[typ], r)
			}
			slices.SortFunc(d.Resources[typ], func(a, b ConfigDumpRaw) int { return strings.Compare(a.Name, b.Name) })
		}
		dump.DynamicResources = d
		effective.Listeners = append(effective.Listeners, v.set.Listeners...)
		effective.Clusters = append(effective.Clusters, v.set.Clusters...)
	}
	effective.Server.Concurrency = s.concurrency
	effective.Listeners = redactListeners(effective.Listeners)
	effective.Clusters = redactClusters(effective.Clusters)
	dump.Config = effective
	writeJSON(w, dump)
}

// redactListeners returns ls with their TLS key references replaced (a
// copy: the configuration serving is not touched).
func redactListeners(ls []config.Listener) []config.Listener {
	out := slices.Clone(ls)
	if out == nil {
		out = []config.Listener{}
	}
	for i := range out {
		t := out[i].TLS
		if t == nil {
			continue
		}
		c := *t
		c.Certificates = slices.Clone(t.Certificates)
		for j := range c.Certificates {
			if c.Certificates[j].Key != "" {
				c.Certificates[j].Key = redacted
			}
			if strings.Contains(c.Certificates[j].Cert, "PRIVATE KEY") {
				c.Certificates[j].Cert = redacted
			}
		}
		if c.SessionTicketKeysFile != "" {
			c.SessionTicketKeysFile = redacted
		}
		out[i].TLS = &c
	}
	return out
}

// redactClusters returns cs with their client key references replaced.
func redactClusters(cs []config.Cluster) []config.Cluster {
	out := slices.Clone(cs)
	if out == nil {
		out = []config.Cluster{}
	}
	for i := range out {
		t := out[i].TLS
		if t == nil {
			continue
		}
		c := *t
		if c.Key != "" {
			c.Key = redacted
		}
		if strings.Contains(c.Cert, "PRIVATE KEY") {
			c.Cert = redacted
		}
		out[i].TLS = &c
	}
	return out
}
