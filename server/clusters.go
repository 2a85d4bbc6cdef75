package server

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/hotproxy/hotproxy/upstream"
)

// ClustersDump is GET /clusters?format=json.
type ClustersDump struct {
	Clusters []upstream.ClusterStatus `json:"clusters"`
}

// handleClusters shows every cluster of this generation, each endpoint's
// health (checked, ejected) and its counters. The text form is Envoy's:
// one "cluster::endpoint::field::value" line per fact.
func (s *Server) handleClusters(w http.ResponseWriter, r *http.Request) {
	var dump ClustersDump
	for _, c := range s.snapshot.Load().Clusters() {
		dump.Clusters = append(dump.Clusters, c.Status())
	}
	switch r.URL.Query().Get("format") {
	case "json":
		if dump.Clusters == nil {
			dump.Clusters = []upstream.ClusterStatus{}
		}
		writeJSON(w, dump)
		return
	case "", "text":
	default:
		http.Error(w, fmt.Sprintf("format %q: unknown (use format=json, or leave it out for text)", r.URL.Query().Get("format")), http.StatusBadRequest)
		return
	}
	var b strings.Builder
	for _, cs := range dump.Clusters {
		fmt.Fprintf(&b, "%s::panic::%t\n", cs.Name, cs.Panic)
		if br := cs.Breakers; br != nil {
			fmt.Fprintf(&b, "%s::circuit_breakers::max_connections::%d::in_use::%d\n", cs.Name, br.MaxConnections, br.Connections)
			fmt.Fprintf(&b, "%s::circuit_breakers::max_pending_requests::%d::in_use::%d\n", cs.Name, br.MaxPendingRequests, br.PendingRequests)
			fmt.Fprintf(&b, "%s::circuit_breakers::max_requests::%d::in_use::%d\n", cs.Name, br.MaxRequests, br.Requests)
			fmt.Fprintf(&b, "%s::circuit_breakers::max_retries::%d::in_use::%d\n", cs.Name, br.MaxRetries, br.Retries)
		}
		for _, e := range cs.Endpoints {
			p := cs.Name + "::" + e.Address + "::"
			fmt.Fprintf(&b, "%shealth_check::%s\n", p, e.HealthCheck)
			fmt.Fprintf(&b, "%sejected::%t\n", p, e.Ejected)
			if e.Ejected {
				fmt.Fprintf(&b, "%sejected_until::%s\n", p, e.EjectedUntil)
			}
			fmt.Fprintf(&b, "%sejections::%d\n", p, e.Ejections)
			fmt.Fprintf(&b, "%srq_total::%d\n", p, e.RqTotal)
			fmt.Fprintf(&b, "%srq_5xx::%d\n", p, e.Rq5xx)
			fmt.Fprintf(&b, "%scx_connect_fail::%d\n", p, e.CxConnectFail)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte(b.String()))
}
