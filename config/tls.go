package config

import (
	"path/filepath"
	"time"
)

// TLS defaults.
const (
	// DefaultTLSMinVersion: TLS 1.0 and 1.1 are deprecated (RFC 8996).
	DefaultTLSMinVersion = "1.2"
	// DefaultTLSMaxVersion: the highest crypto/tls speaks.
	DefaultTLSMaxVersion = "1.3"
	// DefaultSessionTicketRotation is how often a listener's session-ticket
	// key is replaced; the previous keys still decrypt tickets for two
	// more rotations, so a ticket lives at most about three times this.
	DefaultSessionTicketRotation = time.Hour
	// DefaultHandshakeTimeout bounds a TLS handshake from the accept.
	DefaultHandshakeTimeout = 10 * time.Second
)

// TLS versions, as written in the config.
const (
	TLSVersion12 = "1.2"
	TLSVersion13 = "1.3"
)

// ALPN protocol names an http listener may offer.
const (
	ALPNHTTP2  = "h2"
	ALPNHTTP11 = "http/1.1"
)

// DefaultHTTPALPN is what an http listener with TLS offers when alpn is
// left out: HTTP/2 first, HTTP/1.1 for the rest.
var DefaultHTTPALPN = []string{ALPNHTTP2, ALPNHTTP11}

// ListenerTLS terminates TLS on a listener: an http listener serves
// HTTPS (HTTP/1.1, and HTTP/2 when ALPN picks h2); a tcp listener
// streams the plaintext to its cluster.
type ListenerTLS struct {
	// Certificates are the listener's certificate/key pairs (PEM files).
	// The first is the default; a ClientHello's SNI picks the pair whose
	// certificate names it (exact, then "*.example.com" wildcards).
	Certificates []CertificatePair `toml:"certificates" json:"certificates"`
	// MinVersion is the lowest TLS version accepted: "1.2" or "1.3".
	MinVersion string `toml:"min_version" json:"min_version" default:"1.2"`
	// MaxVersion is the highest TLS version offered: "1.3" (default) or
	// "1.2" (for a client population, or a comparison, that needs 1.2).
	MaxVersion string `toml:"max_version" json:"max_version" default:"1.3"`
	// CipherSuites restricts the TLS 1.2 cipher suites, by their IANA
	// names ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"); empty: Go's secure
	// defaults. TLS 1.3 suites are not configurable.
	CipherSuites []string `toml:"cipher_suites,omitempty" json:"cipher_suites,omitempty"`
	// ALPN lists the application protocols offered, most preferred
	// first. http listeners: "h2" and "http/1.1" (default both); tcp
	// listeners: any names, default none.
	ALPN []string `toml:"alpn" json:"alpn"`
	// SessionTicketRotation is how often the session-ticket key is
	// replaced. The keys are handed to the next generation at a hot
	// restart, so a client's ticket resumes across it.
	SessionTicketRotation Duration `toml:"session_ticket_rotation" json:"session_ticket_rotation" default:"1h" bound:"1m..168h"`
	// SessionTicketKeysFile, when set, takes the session-ticket keys from
	// a file shared by a fleet (re-read at each rotation) instead of
	// generating them; see docs for its format.
	SessionTicketKeysFile string `toml:"session_ticket_keys_file,omitempty" json:"session_ticket_keys_file,omitempty"`
	// HandshakeTimeout bounds a handshake from the accept.
	HandshakeTimeout Duration `toml:"handshake_timeout" json:"handshake_timeout" default:"10s" bound:"10ms..5m"`
}

// CertificatePair is a certificate chain and its private key, PEM files.
type CertificatePair struct {
	Cert string `toml:"cert" json:"cert"`
	Key  string `toml:"key" json:"key"`
}

// SNIRoute sends a tcp listener's TLS connections whose ClientHello names
// one of ServerNames to Cluster, untouched (TLS passthrough: the proxy
// never decrypts them).
type SNIRoute struct {
	// ServerNames match the SNI exactly, or "*.example.com" any
	// subdomain of example.com.
	ServerNames []string `toml:"server_names" json:"server_names"`
	Cluster     string   `toml:"cluster" json:"cluster"`
}

// ClusterTLS makes a cluster's upstream connections TLS.
type ClusterTLS struct {
	// CA is a PEM bundle of the authorities the upstream's certificate
	// must chain to; empty: the system's pool.
	CA string `toml:"ca,omitempty" json:"ca,omitempty"`
	// ServerName is sent as SNI and is the name the certificate must
	// hold; empty: the endpoint's host (a name, or an IP address
	// verified against the certificate's IP SANs).
	ServerName string `toml:"server_name,omitempty" json:"server_name,omitempty"`
	// Cert and Key, both or neither: a client certificate for upstreams
	// that ask for one (mutual TLS).
	Cert string `toml:"cert,omitempty" json:"cert,omitempty"`
	Key  string `toml:"key,omitempty" json:"key,omitempty"`
	// MinVersion is the lowest TLS version accepted: "1.2" or "1.3".
	MinVersion string `toml:"min_version" json:"min_version" default:"1.2"`
	// InsecureSkipVerify accepts any certificate the upstream shows.
	// Verification is on unless this says otherwise; use it for tests.
	InsecureSkipVerify bool `toml:"insecure_skip_verify,omitzero" json:"insecure_skip_verify,omitempty"`
}

// resolveFiles makes the TLS files' paths absolute: a relative one is
// relative to the directory of the config file (source), so that a config
// and the certificates beside it move together, and a generation started
// from another directory reads the same files.
func (c *Config) resolveFiles(source string) {
	dir := "."
	if source != DefaultSource {
		dir = filepath.Dir(source)
	}
	abs := func(p *string) {
		if *p == "" || filepath.IsAbs(*p) {
			return
		}
		if a, err := filepath.Abs(filepath.Join(dir, *p)); err == nil {
			*p = a
		}
	}
	for i := range c.Listeners {
		if t := c.Listeners[i].TLS; t != nil {
			for j := range t.Certificates {
				abs(&t.Certificates[j].Cert)
				abs(&t.Certificates[j].Key)
			}
			abs(&t.SessionTicketKeysFile)
		}
	}
	for i := range c.Clusters {
		if t := c.Clusters[i].TLS; t != nil {
			abs(&t.CA)
			abs(&t.Cert)
			abs(&t.Key)
		}
	}
}
