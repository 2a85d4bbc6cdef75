package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

var tlsVersions = []string{TLSVersion12, TLSVersion13}

// TLSVersion maps a config TLS version to crypto/tls's constant (0 for
// one Validate refuses).
func TLSVersion(v string) uint16 {
	switch v {
	case TLSVersion12:
		return tls.VersionTLS12
	case TLSVersion13:
		return tls.VersionTLS13
	}
	return 0
}

// CipherSuiteID returns the id of a secure TLS 1.2 cipher suite by its
// IANA name, and whether there is one.
func CipherSuiteID(name string) (uint16, bool) {
	for _, cs := range tls.CipherSuites() {
		if cs.Name == name && slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
			return cs.ID, true
		}
	}
	return 0, false
}

// SessionTicketKeySize is the size of one session-ticket key.
const SessionTicketKeySize = 32

// ParseSessionTicketKeys reads a session-ticket keys file: one key per
// line, each 32 random bytes in standard base64 (openssl rand -base64
// 32), the first encrypting new tickets and all of them decrypting. Blank
// lines and lines starting with # are skipped.
func ParseSessionTicketKeys(data []byte) ([][SessionTicketKeySize]byte, error) {
	var keys [][SessionTicketKeySize]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(b) != SessionTicketKeySize {
			return nil, fmt.Errorf("line %d: not a key (each line is %d random bytes in base64, as openssl rand -base64 %d writes)", i+1, SessionTicketKeySize, SessionTicketKeySize)
		}
		keys = append(keys, [SessionTicketKeySize]byte(b))
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in it (one key per line, the first encrypts new tickets)")
	}
	return keys, nil
}

// LoadCertificatePair loads and checks one certificate/key pair: both PEM,
// the key matching the certificate; Leaf is set.
func LoadCertificatePair(p CertificatePair) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		return nil, fmt.Errorf("cert %s, key %s: %w", p.Cert, p.Key, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("cert %s: %w", p.Cert, err)
		}
	}
	return &c, nil
}

// LoadCAPool reads a PEM bundle of certificate authorities.
func LoadCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

func (v *validator) listenerTLS(key string, l *Listener) {
	t := l.TLS
	if t == nil {
		if l.HTTP2Cleartext && l.Protocol != ProtocolHTTP {
			v.ps.add(key+".http2_cleartext", "applies only to http listeners; remove it")
		}
		for j, r := range l.Routes {
			if r.ServerName != "" {
				v.ps.add(fmt.Sprintf("%s.routes[%d].server_name", key, j), "%s: matches the SNI of TLS connections, and this listener has no [listeners.tls]; add one, or use host", quote(r.ServerName))
			}
		}
		return
	}
	if l.ParkIdleConnections != nil && *l.ParkIdleConnections {
		v.ps.add(key+".park_idle_connections", "applies to connections without TLS (crypto/tls may hold a TLS connection's next request, which no poller would see); remove it (a listener with TLS never parks), or serve this traffic on a listener without [listeners.tls]")
	}
	key += ".tls"
	if l.HTTP2Cleartext {
		v.ps.add(key, "a listener with TLS offers HTTP/2 by ALPN (alpn = [\"h2\", \"http/1.1\"]); remove http2_cleartext, which is for listeners without TLS")
	}
	if len(l.SNIRoutes) > 0 {
		v.ps.add(key, "sni_routes pass TLS through untouched, [listeners.tls] terminates it: a listener does one or the other; remove one")
	}
	if len(t.Certificates) == 0 {
		v.ps.add(key+".certificates", "missing: TLS needs at least one certificate, like certificates = [{ cert = \"/etc/hotproxy/site.pem\", key = \"/etc/hotproxy/site.key\" }]")
	}
	for j, p := range t.Certificates {
		v.certificatePair(fmt.Sprintf("%s.certificates[%d]", key, j), p)
	}
	if !slices.Contains(tlsVersions, t.MinVersion) {
		v.ps.add(key+".min_version", "%s: use %s (TLS 1.0 and 1.1 are deprecated, RFC 8996)", quote(t.MinVersion), orList(quoteAll(tlsVersions)))
	}
	if !slices.Contains(tlsVersions, t.MaxVersion) {
		v.ps.add(key+".max_version", "%s: use %s", quote(t.MaxVersion), orList(quoteAll(tlsVersions)))
	} else if TLSVersion(t.MaxVersion) < TLSVersion(t.MinVersion) {
		v.ps.add(key+".max_version", "%s is below min_version %s", quote(t.MaxVersion), quote(t.MinVersion))
	}
	v.cipherSuites(key+".cipher_suites", t.CipherSuites, t.MinVersion)
	seen := map[string]bool{}
	for j, p := range t.ALPN {
		k := fmt.Sprintf("%s.alpn[%d]", key, j)
		switch {
		case l.Protocol == ProtocolHTTP && p != ALPNHTTP2 && p != ALPNHTTP11:
			v.ps.add(k, "%s: an http listener speaks %s", quote(p), orList(quoteAll([]string{ALPNHTTP2, ALPNHTTP11})))
		case p == "" || len(p) > 255:
			v.ps.add(k, "%s: a protocol name is 1 to 255 bytes", quote(p))
		case seen[p]:
			v.ps.add(k, "%s: listed twice", quote(p))
		}
		seen[p] = true
	}
	if l.Protocol == ProtocolHTTP && t.ALPN != nil && len(t.ALPN) == 0 {
		v.ps.add(key+".alpn", "empty: an http listener offers at least \"http/1.1\" (leave alpn out for [\"h2\", \"http/1.1\"])")
	}
	if f := t.SessionTicketKeysFile; f != "" {
		k := key + ".session_ticket_keys_file"
		if b, err := os.ReadFile(f); err != nil {
			v.ps.add(k, "%v", err)
		} else if _, err := ParseSessionTicketKeys(b); err != nil {
			v.ps.add(k, "%s: %v", f, err)
		}
	}
}

// sniRoutes checks a tcp listener's TLS passthrough routes.
func (v *validator) sniRoutes(key string, l *Listener) {
	if len(l.SNIRoutes) > 0 && l.Protocol != ProtocolTCP {
		v.ps.add(key+".sni_routes", "TLS passthrough is for tcp listeners; an http listener routes by server_name in its routes")
		return
	}
	names := map[string]string{}
	for j, r := range l.SNIRoutes {
		k := fmt.Sprintf("%s.sni_routes[%d]", key, j)
		if len(r.ServerNames) == 0 {
			v.ps.add(k+".server_names", "missing: the SNI names this route takes, like server_names = [\"db.example.com\"]")
		}
		for n, name := range r.ServerNames {
			nk := fmt.Sprintf("%s.server_names[%d]", k, n)
			if msg := checkServerName(name); msg != "" {
				v.ps.add(nk, "%s: %s", quote(name), msg)
				continue
			}
			lower := strings.ToLower(name)
			if other, ok := names[lower]; ok {
				v.ps.add(nk, "%s: %s names it already; the first route would always win", quote(name), other)
			}
			names[lower] = k
		}
		if r.Cluster == "" {
			v.ps.add(k+".cluster", "missing: the cluster these connections go to")
		} else {
			v.clusterRef(k+".cluster", r.Cluster)
		}
	}
}

// checkServerName checks an SNI name to match: a hostname, or a wildcard
// "*.example.com" (no port: SNI has none; no IP address: SNI never holds
// one, RFC 6066 §3).
func checkServerName(name string) string {
	if strings.Contains(name, ":") {
		return "an SNI name has no port"
	}
	if msg := checkRouteHost(name); msg != "" {
		return msg
	}
	if !validHostname(strings.TrimPrefix(name, "*.")) {
		return "not a hostname (SNI never holds an IP address)"
	}
	return ""
}

func (v *validator) clusterTLS(key string, c *Cluster) {
	t := c.TLS
	if t == nil {
		return
	}
	key += ".tls"
	if t.CA != "" {
		if _, err := LoadCAPool(t.CA); err != nil {
			v.ps.add(key+".ca", "%v", err)
		}
	}
	if t.ServerName != "" {
		if msg := checkServerName(t.ServerName); msg != "" || strings.HasPrefix(t.ServerName, "*.") {
			if msg == "" {
				msg = "a wildcard cannot be sent as SNI; name one host"
			}
			v.ps.add(key+".server_name", "%s: %s", quote(t.ServerName), msg)
		}
	}
	switch {
	case (t.Cert == "") != (t.Key == ""):
		v.ps.add(key, "a client certificate needs both cert and key (or neither)")
	case t.Cert != "":
		v.certificatePair(key, CertificatePair{Cert: t.Cert, Key: t.Key})
	}
	if !slices.Contains(tlsVersions, t.MinVersion) {
		v.ps.add(key+".min_version", "%s: use %s", quote(t.MinVersion), orList(quoteAll(tlsVersions)))
	}
}

func (v *validator) certificatePair(key string, p CertificatePair) {
	if p.Cert == "" {
		v.ps.add(key+".cert", "missing: the certificate chain's PEM file")
	}
	if p.Key == "" {
		v.ps.add(key+".key", "missing: the private key's PEM file")
	}
	if p.Cert == "" || p.Key == "" {
		return
	}
	if _, err := LoadCertificatePair(p); err != nil {
		v.ps.add(key, "%v", err)
	}
}

func (v *validator) cipherSuites(key string, names []string, minVersion string) {
	if len(names) > 0 && minVersion == TLSVersion13 {
		v.ps.add(key, "applies to TLS 1.2, and min_version is \"1.3\"; remove it")
		return
	}
	for j, name := range names {
		if _, ok := CipherSuiteID(name); ok {
			continue
		}
		msg := "unknown TLS 1.2 cipher suite"
		for _, cs := range tls.InsecureCipherSuites() {
			if cs.Name == name {
				msg = "insecure cipher suite, not offered"
			}
		}
		var known []string
		for _, cs := range tls.CipherSuites() {
			if slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
				known = append(known, cs.Name)
			}
		}
		v.ps.add(fmt.Sprintf("%s[%d]", key, j), "%s: %s (use %s)", quote(name), msg, strings.Join(known, ", "))
	}
}

func quoteAll(l []string) []string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = quote(s)
	}
	return q
}
