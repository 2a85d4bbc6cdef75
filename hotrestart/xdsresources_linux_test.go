package hotrestart

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// xdsSource is a recorder that hands over xDS resources.
type xdsSource struct {
	*recorder
	res *XDSResources
}

func (x xdsSource) XDSResources() *XDSResources { return x.res }

var _ XDSResourceSource = xdsSource{}

// TestXDSResourcesCrossTheSocket: a parent whose handler holds xDS
// resources offers the feature and hands them over byte for byte with
// their versions, in as many chunks as they take (a 200 KB resource is
// more than one datagram); the hand-over then goes on (sockets, drain).
func TestXDSResourcesCrossTheSocket(t *testing.T) {
	for _, size := range []int{0, 100, 200 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			var res *XDSResources
			if size > 0 {
				big := make([]byte, size)
				rand.Read(big)
				res = &XDSResources{
					Versions: map[string]string{"type.googleapis.com/envoy.config.cluster.v3.Cluster": "v7"},
					Updated:  map[string]int64{"type.googleapis.com/envoy.config.cluster.v3.Cluster": 1234},
					Resources: []XDSResource{
						{Type: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Name: "a", Version: "3", Any: big},
						{Type: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Name: "b", Any: []byte{1}},
					},
				}
			}
			h := xdsSource{recorder: newRecorder(t, 1), res: res}
			p := startParent(t, h, ParentOptions{})
			ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			if !slices.Contains(ch.Parent().Features, FeatureXDSResources) {
				t.Fatalf("parent features %v lack %q", ch.Parent().Features, FeatureXDSResources)
			}
			got, offered, err := ch.XDSResources()
			if err != nil || !offered {
				t.Fatalf("XDSResources: offered %v, %v", offered, err)
			}
			if res == nil {
				if got != nil {
					t.Fatalf("a parent with none handed over %+v", got)
				}
			} else {
				if got == nil || len(got.Resources) != 2 || got.Versions[res.Resources[0].Type] != "v7" || got.Updated[res.Resources[0].Type] != 1234 {
					t.Fatalf("received %+v", got)
				}
				for i, want := range res.Resources {
					g := got.Resources[i]
					if g.Type != want.Type || g.Name != want.Name || g.Version != want.Version || !bytes.Equal(g.Any, want.Any) {
						t.Fatalf("resource %d: %s %s %s (%d bytes), want %s %s %s (%d bytes)", i, g.Type, g.Name, g.Version, len(g.Any),
							want.Type, want.Name, want.Version, len(want.Any))
					}
				}
			}
			_, files, err := ch.Sockets()
			if err != nil {
				t.Fatalf("Sockets after XDSResources: %v", err)
			}
			CloseFiles(files)
			if err := ch.Drain(nil); err != nil {
				t.Fatalf("Drain: %v", err)
			}
		})
	}
}

// TestXDSResourcesFromAnOlderParent: a parent without the feature is not
// asked, and the hand-over goes on.
func TestXDSResourcesFromAnOlderParent(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if slices.Contains(ch.Parent().Features, FeatureXDSResources) {
		t.Fatalf("a parent without XDSResourceSource offers %q", FeatureXDSResources)
	}
	res, offered, err := ch.XDSResources()
	if offered || err != nil || res != nil {
		t.Fatalf("XDSResources from a parent without the feature: %v, offered %v, %v", res, offered, err)
	}
	_, files, err := ch.Sockets()
	if err != nil {
		t.Fatalf("Sockets: %v (asking broke the session?)", err)
	}
	CloseFiles(files)
	if err := ch.Drain(nil); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeRefusesBadXDSResources: an oversized chunk, and resources
// that lack a type, a name or bytes, are refused by name.
func TestDecodeRefusesBadXDSResources(t *testing.T) {
	big := strings.Repeat("A", (xdsChunkBytes+3)/3*4+8)
	if _, err := decodeMessage([]byte(`{"type":"xds_resources","chunk":"` + big + `"}`)); err == nil || !strings.Contains(err.Error(), "chunk of") {
		t.Fatalf("an oversized chunk: %v", err)
	}
	for _, bad := range []string{
		`{"resources":[{"type":"","name":"a","any":"AQ=="}]}`,
		`{"resources":[{"type":"t","name":"","any":"AQ=="}]}`,
		`{"resources":[{"type":"t","name":"a"}]}`,
		`{"resources":[],"extra":1}`,
		`{"resources":[]} {}`,
	} {
		if _, err := decodeXDSResources([]byte(bad)); err == nil || !strings.Contains(err.Error(), "malformed xds_resources") {
			t.Errorf("%s: %v, want a malformed xds_resources error", bad, err)
		}
	}
}
