package tlsconf

import (
	"crypto/tls"
	"strings"
)

// certSet is one listener's certificates as served at one moment. It is
// never changed once published: a reload builds a new one.
type certSet struct {
	// pairs are in the order of the listener's certificates list; the
	// first is the default.
	pairs []*tls.Certificate
	// exact maps a lower-case DNS name of a certificate to the first pair
	// naming it; wildcard maps "example.com" to the first pair naming
	// "*.example.com".
	exact    map[string]*tls.Certificate
	wildcard map[string]*tls.Certificate
}

func newCertSet(pairs []*tls.Certificate) *certSet {
	cs := &certSet{
		pairs:    pairs,
		exact:    map[string]*tls.Certificate{},
		wildcard: map[string]*tls.Certificate{},
	}
	for _, p := range pairs {
		for _, name := range p.Leaf.DNSNames {
			name = strings.ToLower(strings.TrimSuffix(name, "."))
			m, key := cs.exact, name
			if parent, ok := strings.CutPrefix(name, "*."); ok {
				m, key = cs.wildcard, parent
			}
			if _, taken := m[key]; !taken && key != "" {
				m[key] = p // the first pair in the list that names it wins
			}
		}
	}
	return cs
}

// choose returns the certificate for a ClientHello's SNI: a certificate
// naming it exactly, else one whose wildcard covers it (one label, as in
// RFC 6125 §6.4.3: "*.example.com" covers "a.example.com", neither
// "example.com" nor "a.b.example.com"), else the default. named says
// whether a certificate named it. Names are matched case-insensitively.
func (cs *certSet) choose(serverName string) (cert *tls.Certificate, named bool) {
	if serverName != "" {
		name := strings.ToLower(strings.TrimSuffix(serverName, "."))
		if c, ok := cs.exact[name]; ok {
			return c, true
		}
		if _, parent, ok := strings.Cut(name, "."); ok {
			if c, ok := cs.wildcard[parent]; ok {
				return c, true
			}
		}
	}
	return cs.pairs[0], false
}
