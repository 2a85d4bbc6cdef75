package workers

// TEMPORARY (issue 13, until the uptls branch is merged): a minimal client
// TLS config builder for HTTP/2 upstreams over TLS, so that the h2 branch
// compiles and is tested on its own. At the merge, newH2ClientTLS's caller
// takes package upstream's builder (NewClientTLS) instead and this file is
// deleted.

import (
	"crypto/tls"
	"fmt"

	"github.com/hotproxy/hotproxy/config"
)

// newH2ClientTLS is the TLS config of a cluster's HTTP/2 connections:
// ALPN "h2" only, verification as [clusters.tls] says.
func newH2ClientTLS(c *config.ClusterTLS) (*tls.Config, error) {
	cfg := &tls.Config{
		NextProtos:         []string{"h2"},
		ServerName:         c.ServerName, // empty: the endpoint's host, per connection
		MinVersion:         config.TLSVersion(c.MinVersion),
		InsecureSkipVerify: c.InsecureSkipVerify,
	}
	if c.CA != "" {
		pool, err := config.LoadCAPool(c.CA)
		if err != nil {
			return nil, fmt.Errorf("clusters.tls.ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if c.Cert != "" {
		pair, err := config.LoadCertificatePair(config.CertificatePair{Cert: c.Cert, Key: c.Key})
		if err != nil {
			return nil, fmt.Errorf("clusters.tls.cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{*pair}
	}
	return cfg, nil
}
