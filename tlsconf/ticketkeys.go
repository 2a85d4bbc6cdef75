package tlsconf

import (
	"crypto/rand"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// TicketKey is one session-ticket key and when it was made. The keys are
// secrets: whoever has them can decrypt every session they protected.
// Never log them.
type TicketKey struct {
	Key     [config.SessionTicketKeySize]byte
	Created time.Time
}

// TicketKeyRing is one listener's session-ticket keys as handed to the
// next generation: Keys, newest (the encrypting one) first, and Next, the
// key made in advance that the next rotation will make the encrypting one.
//
// Next is why a rotation in the middle of a hand-over loses nothing: the
// generation that hands over and the one that takes over rotate at the
// same moment (from the same Created) to the same key, and each accepts
// it already, so a ticket either issues resumes on the other.
type TicketKeyRing struct {
	Keys []TicketKey
	Next TicketKey
}

// keptTicketKeys is how many keys a listener holds: the one that encrypts
// new tickets and the two before it, which still decrypt, so a ticket
// resumes for two rotations after the one it was issued in.
const keptTicketKeys = 3

// newTicketKey makes a random key.
func newTicketKey(now time.Time) (TicketKey, error) {
	k := TicketKey{Created: now}
	if _, err := rand.Read(k.Key[:]); err != nil {
		return TicketKey{}, fmt.Errorf("generating a session-ticket key: %w", err)
	}
	return k, nil
}

// readTicketKeysFile reads session_ticket_keys_file: its keys, in its order
// (the first encrypts).
func readTicketKeysFile(path string, now time.Time) ([]TicketKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	raw, err := config.ParseSessionTicketKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	keys := make([]TicketKey, len(raw))
	for i, k := range raw {
		keys[i] = TicketKey{Key: k, Created: now}
	}
	return keys, nil
}

// installKeysLocked gives the listener's tls.Config its keys, the first
// encrypting, and l.next too, for decryption only (see TicketKeyRing).
// tls.Config guards them with its own mutex, so handshakes under way are
// safe; calling SetSessionTicketKeys also turns crypto/tls's own rotation
// off, which would otherwise make keys no other generation knows.
// l.keysMu must be held.
func (l *listener) installKeysLocked(keys []TicketKey) {
	l.keys = keys
	raw := make([][config.SessionTicketKeySize]byte, 0, len(keys)+1)
	for _, k := range keys {
		raw = append(raw, k.Key)
	}
	if l.keysFile == "" {
		raw = append(raw, l.next.Key)
	}
	l.tlsConfig.SetSessionTicketKeys(raw)
}

// nextRotation is when the listener's keys are next due to rotate.
func (l *listener) nextRotation() time.Time {
	l.keysMu.Lock()
	defer l.keysMu.Unlock()
	return l.keys[0].Created.Add(l.rotation)
}

// rotateTicketKeys makes a new key the encrypting one and keeps the
// previous two for decryption; with a keys file, it reads the file again
// instead (a fleet rotates the file; every proxy picks it up at its next
// rotation). It reports whether the keys changed.
func (l *listener) rotateTicketKeys(now time.Time) (bool, error) {
	if l.keysFile != "" {
		keys, err := readTicketKeysFile(l.keysFile, now)
		l.keysMu.Lock()
		defer l.keysMu.Unlock()
		if err != nil {
			// Keep serving with the keys we have, and try again at the
			// next rotation.
			l.keys[0].Created = now
			return false, fmt.Errorf("listener %q: session_ticket_keys_file: %w (the previous keys stay in use)", l.name, err)
		}
		changed := !sameKeys(keys, l.keys)
		if changed {
			l.installKeysLocked(keys)
		} else {
			l.keys[0].Created = now
		}
		return changed, nil
	}
	next, err := newTicketKey(now)
	if err != nil {
		return false, fmt.Errorf("listener %q: %w", l.name, err)
	}
	l.keysMu.Lock()
	defer l.keysMu.Unlock()
	k := l.next // made in advance: a generation we handed it to rotates to it too
	k.Created = now
	l.next = next
	keys := append([]TicketKey{k}, l.keys...)
	l.installKeysLocked(keys[:min(len(keys), keptTicketKeys)])
	return true, nil
}

func sameKeys(a, b []TicketKey) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key {
			return false
		}
	}
	return true
}

// TicketKeys returns the session-ticket keys of every listener that made
// its own (not those read from a session_ticket_keys_file: the next
// generation reads the file itself), for the next generation. Safe to
// call from any goroutine.
func (s *Set) TicketKeys() map[string]TicketKeyRing {
	out := map[string]TicketKeyRing{}
	for _, l := range s.listeners {
		if l.keysFile != "" {
			continue
		}
		l.keysMu.Lock()
		out[l.name] = TicketKeyRing{Keys: slices.Clone(l.keys), Next: l.next}
		l.keysMu.Unlock()
	}
	return out
}

// InstallTicketKeys gives the listeners the keys the previous generation
// used (TicketKeys there), so that tickets it issued resume here, and the
// rotation goes on from when its newest key was made, to the key it made
// in advance, rather than starting over. Listeners that read a keys file,
// and those the previous generation did not have, keep their own keys;
// keys for listeners this set lacks are ignored. Call it before the first
// handshake. It returns the names of the listeners that took keys.
func (s *Set) InstallTicketKeys(byListener map[string]TicketKeyRing) []string {
	var installed []string
	now := time.Now()
	for _, l := range s.listeners {
		ring, ok := byListener[l.name]
		if l.keysFile != "" || !ok || len(ring.Keys) == 0 {
			continue
		}
		keys := slices.Clone(ring.Keys[:min(len(ring.Keys), keptTicketKeys)])
		for i := range keys {
			if keys[i].Created.After(now) || keys[i].Created.IsZero() {
				// Not a time this generation can schedule from.
				keys[i].Created = now
			}
		}
		l.keysMu.Lock()
		if ring.Next.Key != ([config.SessionTicketKeySize]byte{}) {
			l.next = ring.Next
		}
		l.installKeysLocked(keys)
		l.keysMu.Unlock()
		installed = append(installed, l.name)
	}
	return installed
}
