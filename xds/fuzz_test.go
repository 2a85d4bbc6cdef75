package xds

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzResource feeds a control plane's bytes, as a resource of each type,
// through decoding, the checks, the mapping and the resolution: whatever
// they hold, the client refuses them with an error or maps them, and
// never panics.
func FuzzResource(f *testing.F) {
	set := exampleSet(f)
	for _, byName := range set {
		for _, r := range byName {
			var a anypb.Any
			proto.Unmarshal(r.raw, &a)
			f.Add(uint8(0), a.GetValue())
		}
	}
	f.Add(uint8(3), []byte{0x0a, 0x01, 'x', 0x12, 0x00})
	f.Fuzz(func(t *testing.T, kind uint8, value []byte) {
		types := []TypeURL{ListenerType, RouteType, ClusterType, EndpointType, SecretType}
		typ := types[int(kind)%len(types)]
		a := &anypb.Any{TypeUrl: string(typ), Value: value}
		r, err := decodeResource(typ, a, "v")
		if err != nil {
			return
		}
		m := testMapper(t)
		if err := m.mapResource(typ, r); err != nil {
			return
		}
		s := map[TypeURL]map[string]*resource{typ: {r.name: r}}
		resolve(s)
	})
}
