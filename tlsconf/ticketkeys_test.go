package tlsconf

import (
	"crypto/tls"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

var tlsVersions = []struct {
	name string
	v    uint16
}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}}

// clientWithCache is a client of version v that keeps its sessions.
func clientWithCache(ca *testCA, v uint16) *tls.Config {
	return &tls.Config{
		ServerName:         "a.example.com",
		RootCAs:            ca.pool,
		MinVersion:         v,
		MaxVersion:         v,
		ClientSessionCache: tls.NewLRUClientSessionCache(8),
	}
}

// rotateNow rotates the listener's keys on the run goroutine, as its timer
// would.
func rotateNow(tb testing.TB, s *Set) {
	tb.Helper()
	done := make(chan struct{})
	s.calls <- func() {
		s.rotate(s.byName["web"], time.Now())
		close(done)
	}
	<-done
}

// TestRotationKeepsThePreviousKeys: after two rotations a ticket still
// resumes (the key that made it is kept for decryption); after three it
// does not.
func TestRotationKeepsThePreviousKeys(t *testing.T) {
	for _, v := range tlsVersions {
		t.Run(v.name, func(t *testing.T) {
			ca := newTestCA(t)
			s, st := buildSet(t, tlsConfig(ca.writePair(t, t.TempDir(), "a", 1, "a.example.com")))
			addr := serveTLS(t, s.ServerConfigs()["web"])
			// Two clients, each with a ticket made with the first key.
			early, late := clientWithCache(ca, v.v), clientWithCache(ca, v.v)
			for _, c := range []*tls.Config{early, late} {
				if handshake(t, addr, c).DidResume {
					t.Fatal("the first handshake resumed")
				}
			}
			rotateNow(t, s)
			rotateNow(t, s)
			if !handshake(t, addr, early).DidResume {
				t.Error("a ticket of two rotations ago did not resume")
			}
			rotateNow(t, s)
			if handshake(t, addr, late).DidResume {
				t.Error("a ticket of three rotations ago resumed: the key was kept too long")
			}
			if got := counter(st, StatTicketKeyRotation); got != 3 {
				t.Errorf("%s = %d, want 3", StatTicketKeyRotation, got)
			}
		})
	}
}

// TestRotationRunsOnItsInterval: session_ticket_rotation drives the
// rotation (shortened here; the config's minimum does not apply to a
// ListenerTLS built in code).
func TestRotationRunsOnItsInterval(t *testing.T) {
	ca := newTestCA(t)
	lt := tlsConfig(ca.writePair(t, t.TempDir(), "a", 1, "a.example.com"))
	lt.SessionTicketRotation = config.Duration(50 * time.Millisecond)
	s, st := buildSet(t, lt)
	if _, ok := waitFor(5*time.Second, func() bool { return counter(st, StatTicketKeyRotation) >= 3 }); !ok {
		t.Fatalf("%s = %d after 5s with a 50ms rotation", StatTicketKeyRotation, counter(st, StatTicketKeyRotation))
	}
	if n := len(s.TicketKeys()["web"].Keys); n != keptTicketKeys {
		t.Errorf("%d keys kept, want %d", n, keptTicketKeys)
	}
}

// TestResumptionAcrossHandOver: the keys of generation A, installed in
// generation B (as a hot restart does), let a client resume on B with
// the ticket A gave it; B without them does a full handshake.
func TestResumptionAcrossHandOver(t *testing.T) {
	for _, v := range tlsVersions {
		t.Run(v.name, func(t *testing.T) {
			ca := newTestCA(t)
			lt := tlsConfig(ca.writePair(t, t.TempDir(), "a", 1, "a.example.com"))
			a, _ := buildSet(t, lt)
			addrA := serveTLS(t, a.ServerConfigs()["web"])
			client, control := clientWithCache(ca, v.v), clientWithCache(ca, v.v)
			handshake(t, addrA, client)
			handshake(t, addrA, control)

			b, err := Build(&config.Config{Listeners: []config.Listener{{Name: "web", TLS: lt}, {Name: "new", TLS: lt}}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			newKeys := b.TicketKeys()["new"].Keys
			keys := a.TicketKeys()
			if got := b.InstallTicketKeys(keys); len(got) != 1 || got[0] != "web" {
				t.Errorf("InstallTicketKeys installed %v, want [web]", got)
			}
			b.Start(StartOptions{})
			addrB := serveTLS(t, b.ServerConfigs()["web"])
			if !handshake(t, addrB, client).DidResume {
				t.Error("a ticket from generation A did not resume on B, which has A's keys")
			}
			// The rotation goes on from A's newest key, not from B's start.
			if got, want := b.byName["web"].nextRotation(), keys["web"].Keys[0].Created.Add(time.Hour); !got.Equal(want) {
				t.Errorf("next rotation %v, want %v (A's key's time + rotation)", got, want)
			}
			// A listener A did not have keeps its own key.
			if got := b.TicketKeys()["new"].Keys; len(got) != 1 || got[0].Key != newKeys[0].Key {
				t.Error("a listener new in B lost its own key")
			}

			// The control: a generation with fresh keys makes the client
			// do a full handshake, so the test can tell.
			c, _ := buildSet(t, lt)
			if handshake(t, serveTLS(t, c.ServerConfigs()["web"]), control).DidResume {
				t.Error("resumed on a generation without A's keys: the test proves nothing")
			}
		})
	}
}

// TestTicketKeysFile: with session_ticket_keys_file the keys are the
// file's (two proxies with the same file resume each other's tickets),
// re-read at each rotation, and never handed over.
func TestTicketKeysFile(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	lt := tlsConfig(ca.writePair(t, dir, "a", 1, "a.example.com"))
	lt.SessionTicketKeysFile = dir + "/ticket.keys"
	key := func(b byte) string { return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(b), 32))) }
	writeFile(t, lt.SessionTicketKeysFile, []byte("# fleet keys\n"+key('a')+"\n"+key('b')+"\n"))
	one, _ := buildSet(t, lt)
	two, _ := buildSet(t, lt)
	client := clientWithCache(ca, tls.VersionTLS13)
	handshake(t, serveTLS(t, one.ServerConfigs()["web"]), client)
	if !handshake(t, serveTLS(t, two.ServerConfigs()["web"]), client).DidResume {
		t.Error("two sets with the same keys file do not resume each other's tickets")
	}
	if keys := one.TicketKeys(); len(keys) != 0 {
		t.Errorf("keys from a file are handed over: %d listeners", len(keys))
	}
	writeFile(t, lt.SessionTicketKeysFile, []byte(key('c')+"\n"))
	rotateNow(t, one)
	l := one.byName["web"]
	l.keysMu.Lock()
	got := l.keys
	l.keysMu.Unlock()
	if len(got) != 1 || got[0].Key[0] != 'c' {
		t.Errorf("after a rotation the keys are not the file's new ones")
	}
}

// TestRotationDuringTheHandOver: the generation that handed its keys over
// rotates before it stops (its rotation fell due while the next one was
// starting): a ticket it issues with its new key resumes on the next
// generation, which rotates to that same key when its own rotation falls
// due.
func TestRotationDuringTheHandOver(t *testing.T) {
	for _, v := range tlsVersions {
		t.Run(v.name, func(t *testing.T) {
			ca := newTestCA(t)
			lt := tlsConfig(ca.writePair(t, t.TempDir(), "a", 1, "a.example.com"))
			a, _ := buildSet(t, lt)
			b, _ := buildSet(t, lt)
			b.InstallTicketKeys(a.TicketKeys())
			rotateNow(t, a) // after the hand-over of the keys
			client := clientWithCache(ca, v.v)
			handshake(t, serveTLS(t, a.ServerConfigs()["web"]), client)
			if !handshake(t, serveTLS(t, b.ServerConfigs()["web"]), client).DidResume {
				t.Error("a ticket issued after the parent's rotation did not resume on the child")
			}
			rotateNow(t, b)
			if ka, kb := a.TicketKeys()["web"].Keys[0].Key, b.TicketKeys()["web"].Keys[0].Key; ka != kb {
				t.Error("the two generations rotated to different keys")
			}
		})
	}
}
