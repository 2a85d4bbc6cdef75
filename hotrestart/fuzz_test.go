package hotrestart

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeMessage: whatever a peer sends, decoding returns a message or
// an error, never a panic, and an accepted message survives a round trip.
func FuzzDecodeMessage(f *testing.F) {
	for _, seed := range []string{
		`{"type":"hello","version":"1.0","identity":{"pid":1,"epoch":2,"binary_version":"v"}}`,
		`{"type":"sockets","sockets":[{"network":"tcp","address":"127.0.0.1:1","worker":0,"role":"listener"}],"more":true}`,
		`{"type":"hello","version":"1.1","identity":{"pid":1,"epoch":2,"binary_version":"v","features":["supervised","unused_sockets"]}}`,
		`{"type":"drain","unused":[{"network":"tcp","address":"127.0.0.1:2","worker":1,"role":"listener"}]}`,
		`{"type":"get_session_ticket_keys"}`,
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[{"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","created":1}]}],"more":true}`,
		`{"type":"keep_sockets","sockets":[{"network":"tcp","address":"127.0.0.1:1","worker":0,"role":"listener"},{"network":"tcp","address":"127.0.0.1:9901","worker":-1,"role":"admin"}],"more":true}`,
		`{"type":"hello","version":"1.4","identity":{"pid":1,"epoch":0,"binary_version":"v","features":["kept_sockets"]}}`,
		`{"type":"xds_resources","chunk":"AAEC","more":true}`,
		`{"type":"get_sockets"}`, `{"type":"drain"}`, `{"type":"error","error":"x"}`, `{}`, `null`, `[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("re-encoding an accepted message: %v", err)
		}
		if _, err := decodeMessage(again); err != nil {
			t.Fatalf("accepted %q but not its re-encoding %q: %v", b, again, err)
		}
	})
}

// FuzzDecodeXDSResources: whatever a parent sends as its xDS resources,
// decoding returns them or an error, never a panic, and what is accepted
// names a type, a name and bytes for every resource.
func FuzzDecodeXDSResources(f *testing.F) {
	for _, seed := range []string{
		`{"versions":{"t":"1"},"updated":{"t":5},"resources":[{"type":"t","name":"a","version":"2","any":"AQ=="}]}`,
		`{"resources":[]}`, `{}`, `null`, `{"resources":[{"type":"t","name":"a","any":""}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeXDSResources(b)
		if err != nil {
			return
		}
		for i, res := range r.Resources {
			if res.Type == "" || res.Name == "" || len(res.Any) == 0 {
				t.Fatalf("accepted resource %d without a type, a name or bytes: %+v", i, res)
			}
		}
	})
}
