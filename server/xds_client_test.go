package server

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/xds"
)

// TestXDSStateCrossesTheRestartSocketWhole: what a parent sends of its
// accepted xDS state is what the child's client starts from: every
// resource's bytes, each type's version and update time, and each
// resource's own version (delta).
func TestXDSStateCrossesTheRestartSocketWhole(t *testing.T) {
	at := time.Unix(0, 1234567890)
	st := &xds.State{
		Versions:         map[xds.TypeURL]string{xds.ClusterType: "7", xds.EndpointType: "8"},
		ResourceVersions: map[xds.TypeURL]map[string]string{xds.ClusterType: {"a": "r1"}},
		Updated:          map[xds.TypeURL]time.Time{xds.ClusterType: at, xds.EndpointType: {}},
		Raw: map[xds.TypeURL]map[string][]byte{
			xds.ClusterType:  {"a": []byte{1, 2}, "b": []byte{3}},
			xds.EndpointType: {"a": []byte{4}},
		},
	}
	got, err := xdsStateOfWire(wireOfXDSState(st))
	if err != nil {
		t.Fatal(err)
	}
	for typ, byName := range st.Raw {
		for name, raw := range byName {
			if !bytes.Equal(got.Raw[typ][name], raw) {
				t.Errorf("%s %q: %v, want %v", typ.Name(), name, got.Raw[typ][name], raw)
			}
		}
		if len(got.Raw[typ]) != len(byName) || got.Versions[typ] != st.Versions[typ] {
			t.Errorf("%s: %d resources at version %q, want %d at %q", typ.Name(), len(got.Raw[typ]), got.Versions[typ], len(byName), st.Versions[typ])
		}
	}
	if got.ResourceVersions[xds.ClusterType]["a"] != "r1" || got.ResourceVersions[xds.ClusterType]["b"] != "" {
		t.Errorf("resource versions %v", got.ResourceVersions)
	}
	if !got.Updated[xds.ClusterType].Equal(at) {
		t.Errorf("cds updated %v, want %v", got.Updated[xds.ClusterType], at)
	}
}

// TestXDSStateFromTheWireRefusesNonsense: a resource of a type hotproxy
// does not know, or one sent twice, is refused by name.
func TestXDSStateFromTheWireRefusesNonsense(t *testing.T) {
	for _, tc := range []struct {
		w    hotrestart.XDSResources
		want string
	}{
		{hotrestart.XDSResources{Resources: []hotrestart.XDSResource{{Type: "type.googleapis.com/x.Y", Name: "a", Any: []byte{1}}}},
			`handed-over resource "a": unknown xDS resource type "type.googleapis.com/x.Y"`},
		{hotrestart.XDSResources{Resources: []hotrestart.XDSResource{
			{Type: string(xds.ClusterType), Name: "a", Any: []byte{1}}, {Type: string(xds.ClusterType), Name: "a", Any: []byte{2}}}},
			`handed-over clusters "a": sent twice`},
	} {
		if _, err := xdsStateOfWire(&tc.w); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.w, err, tc.want)
		}
	}
}
