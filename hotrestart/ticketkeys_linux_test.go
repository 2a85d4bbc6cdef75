package hotrestart

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// keySource is a recorder that hands over session-ticket keys.
type keySource struct {
	*recorder
	keys []ListenerTicketKeys
}

func (k keySource) SessionTicketKeys() []ListenerTicketKeys { return k.keys }

var _ TicketKeySource = keySource{}

func randomTicketKeys(tb testing.TB, listeners, perListener int) []ListenerTicketKeys {
	tb.Helper()
	var out []ListenerTicketKeys
	for i := range listeners {
		l := ListenerTicketKeys{Listener: fmt.Sprintf("listener-%d", i)}
		for j := range perListener {
			k := TicketKey{Key: make([]byte, TicketKeySize), Created: time.Now().Add(-time.Duration(j) * time.Hour).UnixNano()}
			rand.Read(k.Key)
			l.Keys = append(l.Keys, k)
		}
		next := TicketKey{Key: make([]byte, TicketKeySize), Created: time.Now().UnixNano()}
		rand.Read(next.Key)
		l.Next = &next
		out = append(out, l)
	}
	return out
}

// TestSessionTicketKeysCrossTheSocket: a parent whose handler has keys
// offers the feature and hands every listener's keys over, byte for byte
// with their times, in as many messages as they take; the hand-over then
// goes on (drain).
func TestSessionTicketKeysCrossTheSocket(t *testing.T) {
	for _, listeners := range []int{0, 1, 500} { // 500: more than one message
		t.Run(fmt.Sprint(listeners), func(t *testing.T) {
			h := keySource{recorder: newRecorder(t, 1), keys: randomTicketKeys(t, listeners, 3)}
			p := startParent(t, h, ParentOptions{})
			ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			if !slices.Contains(ch.Parent().Features, FeatureSessionTicketKeys) {
				t.Fatalf("parent features %v lack %q", ch.Parent().Features, FeatureSessionTicketKeys)
			}
			_, files, err := ch.Sockets()
			if err != nil {
				t.Fatal(err)
			}
			CloseFiles(files)
			got, offered, err := ch.SessionTicketKeys()
			if err != nil || !offered {
				t.Fatalf("SessionTicketKeys: offered %v, %v", offered, err)
			}
			if len(got) != len(h.keys) {
				t.Fatalf("%d listeners' keys received, want %d", len(got), len(h.keys))
			}
			for i := range got {
				want := h.keys[i]
				if got[i].Listener != want.Listener || len(got[i].Keys) != len(want.Keys) {
					t.Fatalf("entry %d: %s with %d keys, want %s with %d", i, got[i].Listener, len(got[i].Keys), want.Listener, len(want.Keys))
				}
				if got[i].Next == nil || !bytes.Equal(got[i].Next.Key, want.Next.Key) || got[i].Next.Created != want.Next.Created {
					t.Fatalf("listener %s: the next key differs", want.Listener)
				}
				for j := range want.Keys {
					if !bytes.Equal(got[i].Keys[j].Key, want.Keys[j].Key) || got[i].Keys[j].Created != want.Keys[j].Created {
						t.Fatalf("listener %s key %d differs", want.Listener, j)
					}
				}
			}
			if err := ch.Drain(nil); err != nil {
				t.Fatalf("Drain after the keys: %v", err)
			}
		})
	}
}

// TestSessionTicketKeysFromAnOlderParent: a parent without the feature (a
// handler that has no keys, as an older binary) is not asked, and the
// hand-over goes on untouched.
func TestSessionTicketKeysFromAnOlderParent(t *testing.T) {
	r := newRecorder(t, 1)
	p := startParent(t, r, ParentOptions{})
	ch, err := Dial(p.Addr(), Identity{Epoch: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if slices.Contains(ch.Parent().Features, FeatureSessionTicketKeys) {
		t.Fatalf("a parent without TicketKeySource offers %q", FeatureSessionTicketKeys)
	}
	_, files, err := ch.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(files)
	keys, offered, err := ch.SessionTicketKeys()
	if offered || err != nil || keys != nil {
		t.Fatalf("SessionTicketKeys from a parent without the feature: %v, offered %v, %v", keys, offered, err)
	}
	if err := ch.Drain(nil); err != nil {
		t.Fatalf("Drain: %v (asking for keys broke the session?)", err)
	}
	select {
	case ev := <-r.lost:
		t.Fatalf("the parent lost the child: %+v", ev)
	default:
	}
}

// TestTicketKeysNeverPrinted: a key formatted into a message or a log
// shows no byte of it.
func TestTicketKeysNeverPrinted(t *testing.T) {
	k := TicketKey{Key: bytes.Repeat([]byte{0xAB}, TicketKeySize), Created: 1}
	m := Message{Type: MsgSessionTicketKeys, TicketKeys: []ListenerTicketKeys{{Listener: "web", Keys: []TicketKey{k}, Next: &k}}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		s := fmt.Sprintf(verb, m)
		if strings.Contains(strings.ToLower(s), "ab ab") || strings.Contains(s, "171") || strings.Contains(strings.ToLower(s), "abab") || strings.Contains(s, "q6ur") {
			t.Errorf("%s shows the key: %s", verb, s)
		}
	}
}

// TestDecodeRefusesBadTicketKeys: a key of the wrong size, or without a
// time, or a listener without a name, is a malformed message.
func TestDecodeRefusesBadTicketKeys(t *testing.T) {
	key := strings.Repeat("A", 43) + "=" // 32 zero bytes in base64
	for _, bad := range []string{
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[{"key":"AAAA","created":1}]}]}`,
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[{"key":"` + key + `","created":0}]}]}`,
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"","keys":[{"key":"` + key + `","created":1}]}]}`,
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[]}]}`,
		`{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[{"key":"` + key + `","created":1}],"next":{"key":"AAAA","created":1}}]}`,
	} {
		if _, err := decodeMessage([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	good := `{"type":"session_ticket_keys","ticket_keys":[{"listener":"web","keys":[{"key":"` + key + `","created":1}],"next":{"key":"` + key + `","created":2}}]}`
	if _, err := decodeMessage([]byte(good)); err != nil {
		t.Errorf("refused %s: %v", good, err)
	}
}
