package harness

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// Config builds a hotproxy TOML config for tests. Empty strings and zero
// numbers are left out, so the product's defaults apply; empty addresses
// are filled with free loopback ports by Start (or Allocate).
type Config struct {
	Admin              string // [admin] address; "" = a free port
	Concurrency        int
	DrainTime          string // e.g. "5s"
	ParentShutdownTime string
	TimerSlack         string // [server] timer_slack, e.g. "3ms"
	LogLevel           string
	Listeners          []Listener
	Clusters           []Cluster
	// Extra is raw TOML appended at the end.
	Extra string
}

// Listener is one [[listeners]] table.
type Listener struct {
	Name     string
	Address  string // "" = a free port
	Protocol string // "http" (default when Routes are set) or "tcp"
	Cluster  string // tcp listeners
	Routes   []Route

	IdleTimeout    string
	RequestTimeout string
	HeaderTimeout  string
	MaxHeaderBytes int
	// HTTP2Cleartext writes http2_cleartext = true: the listener serves
	// HTTP/2 with prior knowledge (h2c) without TLS.
	HTTP2Cleartext bool

	// TLS, when set, is the listener's [listeners.tls] table (see
	// DemoCerts.ListenerTLS).
	TLS *ListenerTLS
	// SNIRoutes are [[listeners.sni_routes]]: TLS passthrough on a tcp
	// listener.
	SNIRoutes []SNIRoute
}

// ListenerTLS is a [listeners.tls] table. Empty fields are left out, so
// the product's defaults apply.
type ListenerTLS struct {
	Certificates []CertPair
	MinVersion   string
	// ALPN nil leaves alpn out (the default); empty writes alpn = [].
	ALPN                  []string
	SessionTicketRotation string
	// Extra is raw TOML lines of the table.
	Extra string
}

// CertPair is a certificate chain and its key, PEM files.
type CertPair struct{ Cert, Key string }

// SNIRoute is one [[listeners.sni_routes]] table.
type SNIRoute struct {
	ServerNames []string
	Cluster     string
}

// ClusterTLS is a [clusters.tls] table.
type ClusterTLS struct {
	CA, ServerName, Cert, Key, MinVersion string
	InsecureSkipVerify                    bool
}

// Route is one [[listeners.routes]] table. A non-zero Status makes it a
// direct response.
type Route struct {
	Host, Prefix, Path string
	// ServerName matches the TLS connection's SNI.
	ServerName string
	Cluster    string
	Status     int
	Body       string
	// Extra is raw TOML lines of the route's table ("retry_on = [...]").
	Extra string
}

// Cluster is one [[clusters]] table.
type Cluster struct {
	Name           string
	LBPolicy       string // "" = the product's default
	Endpoints      []string
	ConnectTimeout string
	// TLS, when set, is the cluster's [clusters.tls] table.
	TLS *ClusterTLS
}

// Allocate returns a copy of c whose empty addresses are free loopback
// ports.
func (c Config) Allocate(tb testing.TB) Config {
	tb.Helper()
	if c.Admin == "" {
		c.Admin = FreeAddr(tb)
	}
	c.Listeners = append([]Listener(nil), c.Listeners...)
	for i := range c.Listeners {
		if c.Listeners[i].Address == "" {
			c.Listeners[i].Address = FreeAddr(tb)
		}
	}
	return c
}

// TOML renders c.
func (c Config) TOML() string {
	var b strings.Builder
	q := strconv.Quote
	b.WriteString("[server]\n")
	if c.Concurrency != 0 {
		fmt.Fprintf(&b, "concurrency = %d\n", c.Concurrency)
	}
	if c.DrainTime != "" {
		fmt.Fprintf(&b, "drain_time = %s\n", q(c.DrainTime))
	}
	if c.ParentShutdownTime != "" {
		fmt.Fprintf(&b, "parent_shutdown_time = %s\n", q(c.ParentShutdownTime))
	}
	if c.TimerSlack != "" {
		fmt.Fprintf(&b, "timer_slack = %s\n", q(c.TimerSlack))
	}
	fmt.Fprintf(&b, "\n[admin]\naddress = %s\n", q(c.Admin))
	if c.LogLevel != "" {
		fmt.Fprintf(&b, "\n[log]\nlevel = %s\n", q(c.LogLevel))
	}
	for _, l := range c.Listeners {
		proto := l.Protocol
		if proto == "" {
			proto = "http"
		}
		fmt.Fprintf(&b, "\n[[listeners]]\nname = %s\naddress = %s\nprotocol = %s\n", q(l.Name), q(l.Address), q(proto))
		if l.Cluster != "" {
			fmt.Fprintf(&b, "cluster = %s\n", q(l.Cluster))
		}
		for _, kv := range [][2]string{{"idle_timeout", l.IdleTimeout}, {"request_timeout", l.RequestTimeout}, {"header_timeout", l.HeaderTimeout}} {
			if kv[1] != "" {
				fmt.Fprintf(&b, "%s = %s\n", kv[0], q(kv[1]))
			}
		}
		if l.MaxHeaderBytes != 0 {
			fmt.Fprintf(&b, "max_header_bytes = %d\n", l.MaxHeaderBytes)
		}
		if l.HTTP2Cleartext {
			b.WriteString("http2_cleartext = true\n")
		}
		if t := l.TLS; t != nil {
			writeListenerTLS(&b, t)
		}
		for _, r := range l.SNIRoutes {
			fmt.Fprintf(&b, "\n  [[listeners.sni_routes]]\n  server_names = %s\n  cluster = %s\n", tomlStrings(r.ServerNames), q(r.Cluster))
		}
		for _, r := range l.Routes {
			b.WriteString("\n  [[listeners.routes]]\n")
			for _, kv := range [][2]string{{"host", r.Host}, {"server_name", r.ServerName}, {"prefix", r.Prefix}, {"path", r.Path}, {"cluster", r.Cluster}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, "  %s = %s\n", kv[0], q(kv[1]))
				}
			}
			if r.Status != 0 {
				fmt.Fprintf(&b, "  direct_response = { status = %d, body = %s }\n", r.Status, q(r.Body))
			}
			if r.Extra != "" {
				b.WriteString(r.Extra)
				b.WriteString("\n")
			}
		}
	}
	for _, cl := range c.Clusters {
		fmt.Fprintf(&b, "\n[[clusters]]\nname = %s\n", q(cl.Name))
		if cl.LBPolicy != "" {
			fmt.Fprintf(&b, "lb_policy = %s\n", q(cl.LBPolicy))
		}
		eps := make([]string, len(cl.Endpoints))
		for i, e := range cl.Endpoints {
			eps[i] = q(e)
		}
		fmt.Fprintf(&b, "endpoints = [%s]\n", strings.Join(eps, ", "))
		if cl.ConnectTimeout != "" {
			fmt.Fprintf(&b, "connect_timeout = %s\n", q(cl.ConnectTimeout))
		}
		if t := cl.TLS; t != nil {
			b.WriteString("  [clusters.tls]\n")
			for _, kv := range [][2]string{{"ca", t.CA}, {"server_name", t.ServerName}, {"cert", t.Cert}, {"key", t.Key}, {"min_version", t.MinVersion}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, "  %s = %s\n", kv[0], q(kv[1]))
				}
			}
			if t.InsecureSkipVerify {
				b.WriteString("  insecure_skip_verify = true\n")
			}
		}
	}
	if c.Extra != "" {
		b.WriteString("\n")
		b.WriteString(c.Extra)
		b.WriteString("\n")
	}
	return b.String()
}

// Start allocates free ports for c's empty addresses, starts hotproxy with
// it and waits until it is ready, retrying once with fresh ports if a port
// was taken in between (see StartProxyFunc).
func Start(tb testing.TB, c Config, args ...string) *Proxy {
	tb.Helper()
	return StartProxyFunc(tb, func() string { return c.Allocate(tb).TOML() }, args...)
}

func writeListenerTLS(b *strings.Builder, t *ListenerTLS) {
	q := strconv.Quote
	b.WriteString("  [listeners.tls]\n  certificates = [\n")
	for _, p := range t.Certificates {
		fmt.Fprintf(b, "    { cert = %s, key = %s },\n", q(p.Cert), q(p.Key))
	}
	b.WriteString("  ]\n")
	if t.MinVersion != "" {
		fmt.Fprintf(b, "  min_version = %s\n", q(t.MinVersion))
	}
	if t.ALPN != nil {
		fmt.Fprintf(b, "  alpn = %s\n", tomlStrings(t.ALPN))
	}
	if t.SessionTicketRotation != "" {
		fmt.Fprintf(b, "  session_ticket_rotation = %s\n", q(t.SessionTicketRotation))
	}
	if t.Extra != "" {
		b.WriteString(t.Extra)
		b.WriteString("\n")
	}
}

// tomlStrings renders ss as a TOML array of strings.
func tomlStrings(ss []string) string {
	qs := make([]string, len(ss))
	for i, s := range ss {
		qs[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(qs, ", ") + "]"
}
