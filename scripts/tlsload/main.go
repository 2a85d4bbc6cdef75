// Command tlsload is scripts/bench-peers.sh's load for the tls-resume
// mode: a new TLS connection per request, each client resuming with the
// session tickets its earlier connections got (wrk cannot: it never hands a
// saved session to a new connection, so its tls-close mode is all full
// handshakes). It prints one line of key=value figures, among them how many
// handshakes were full and how many resumed, which shows whether a proxy
// resumed at all.
//
//	tlsload -url https://127.0.0.1:19112/ -ca examples/tls/ca.pem -server-name a.example.com -d 10s
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

func main() {
	url := flag.String("url", "", "the https `URL` to request")
	ca := flag.String("ca", "", "PEM `file` of the CA the server's certificate must chain to")
	serverName := flag.String("server-name", "", "`name` sent as SNI and verified")
	clients := flag.Int("c", 16, "concurrent clients, each with its own session cache")
	duration := flag.Duration("d", 10*time.Second, "how long to run")
	version := flag.String("tls", config.TLSVersion13, "TLS `version`: 1.2 or 1.3 (the only one offered)")
	cache := flag.Bool("resume", true, "keep a session cache per client (false: every handshake is full)")
	flag.Parse()
	if *url == "" || *ca == "" || *serverName == "" {
		fmt.Fprintln(os.Stderr, "tlsload: -url, -ca and -server-name are required")
		os.Exit(2)
	}
	v := config.TLSVersion(*version)
	if v == 0 {
		fmt.Fprintf(os.Stderr, "tlsload: -tls %q: use 1.2 or 1.3\n", *version)
		os.Exit(2)
	}
	tc, err := loadgen.ClientTLS(*ca, *serverName)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tlsload: %v\n", err)
		os.Exit(1)
	}
	tc.MinVersion, tc.MaxVersion = v, v
	// X25519 for the key exchange: what OpenSSL 3.0 (nginx, HAProxy)
	// agrees on; Go would otherwise pick the costlier hybrid
	// X25519MLKEM768 with a Go server. P-256 is listed too, never used
	// for the exchange: in TLS 1.2 an OpenSSL server uses an ECDSA P-256
	// certificate only with a client that lists the curve (RFC 8422
	// §5.1.1), and refuses the rest with "no shared cipher".
	tc.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256}
	res, err := loadgen.Do(context.Background(), loadgen.Options{
		URL: *url, Mode: loadgen.ConnPerRequest, Clients: *clients, Duration: *duration,
		TLS: tc, SessionCache: *cache,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "tlsload: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("requests=%d seconds=%.3f errors=%d full=%d resumed=%d\n",
		res.Total(), res.Elapsed.Seconds(), res.Failed(), res.FullHandshakes, res.ResumedHandshakes)
	if res.Failed() != 0 {
		fmt.Fprintf(os.Stderr, "tlsload: %v\n", res)
	}
}
