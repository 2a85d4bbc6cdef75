package config

import (
	"strings"
	"testing"
	"time"
)

func TestXDSDefaultsAndOff(t *testing.T) {
	c := mustParse(t, webOK+clusterC, "x.toml")
	if c.XDS.Enabled() {
		t.Fatal("xds enabled without an [xds] cluster")
	}
	if c.XDS.Protocol != XDSProtocolDelta || c.XDS.InitialFetchTimeout.D() != 15*time.Second {
		t.Errorf("defaults: protocol %q, initial_fetch_timeout %v; want delta, 15s", c.XDS.Protocol, c.XDS.InitialFetchTimeout.D())
	}
	for _, r := range XDSResourceTypes {
		if !c.XDS.Subscribes(r) {
			t.Errorf("resources default lacks %q", r)
		}
	}
	on := mustParse(t, "[xds]\ncluster = \"c\"\nprotocol = \"sotw\"\nresources = [\"clusters\", \"endpoints\"]\n"+webOK+clusterC, "x.toml")
	if !on.XDS.Enabled() || on.XDS.Protocol != XDSProtocolSotW || on.XDS.Subscribes(XDSListeners) || !on.XDS.Subscribes(XDSEndpoints) {
		t.Errorf("parsed [xds] = %+v", on.XDS)
	}
}

func TestXDSRefused(t *testing.T) {
	for _, tc := range []struct {
		name, toml string
		want       []string
	}{
		{"unknown cluster", "[xds]\ncluster = \"cp\"\n", []string{`xds.cluster: "cp": no such cluster`, `a static cluster of this file: "c"`}},
		{"bad protocol", "[xds]\ncluster = \"c\"\nprotocol = \"grpc\"\n", []string{`xds.protocol: "grpc": unknown protocol (use delta or sotw)`}},
		{"bad resource", "[xds]\ncluster = \"c\"\nresources = [\"clusters\", \"runtime\"]\n", []string{`xds.resources: "runtime": unknown resource type`}},
		{"twice", "[xds]\ncluster = \"c\"\nresources = [\"clusters\", \"clusters\"]\n", []string{`xds.resources: "clusters": listed twice`}},
		{"node without cluster", "[xds]\nnode_id = \"n\"\n", []string{`xds.cluster: missing`}},
		{"unknown key", "[xds]\ncluster = \"c\"\nnode = \"n\"\n", []string{`xds.node`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.toml+webOK+clusterC), "x.toml")
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
