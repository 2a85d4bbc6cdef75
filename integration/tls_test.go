package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// TestTLSSNICertificates (issue 13): each SNI name gets the certificate
// that names it, exact or by wildcard, and a name no certificate holds
// gets the default (the first), counted in ssl.no_certificate; seen by a
// Go client and by openssl s_client.
func TestTLSSNICertificates(t *testing.T) {
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1")
	cfg := httpProxyConfig(backend.Addr)
	cfg.Listeners[0] = tlsListener(demo.ListenerTLS())
	p := harness.Start(t, cfg)
	addr := p.Addr("web")

	for _, tc := range []struct {
		sni, wantName string
	}{
		{"a.example.com", harness.DemoNameA},
		{"b.example.org", harness.DemoNameWildcard},
		{"www.example.org", harness.DemoNameWildcard},
		{"unknown.example.net", harness.DemoNameA}, // the default
	} {
		cc := clientTLS(t, demo.CA, tc.sni)
		if tc.sni == "unknown.example.net" {
			// The default certificate does not name it: verify the chain
			// only, and check the name below.
			cc.InsecureSkipVerify = true
		}
		st, err := handshakeLeaf(addr, cc)
		if err != nil {
			t.Errorf("SNI %s: %v", tc.sni, err)
			continue
		}
		if got := st.PeerCertificates[0].DNSNames; !slices.Equal(got, []string{tc.wantName}) {
			t.Errorf("SNI %s: certificate for %v, want %s", tc.sni, got, tc.wantName)
		}

		out, err := exec.Command("openssl", "s_client", "-connect", addr, "-servername", tc.sni,
			"-CAfile", demo.CA, "-verify_return_error").CombinedOutput()
		if err != nil {
			t.Errorf("openssl s_client -servername %s: %v\n%s", tc.sni, err, out)
			continue
		}
		if subject := opensslSubject(string(out)); !strings.Contains(subject, "CN = "+tc.wantName) {
			t.Errorf("openssl s_client -servername %s: subject %q, want CN = %s\n%s", tc.sni, subject, tc.wantName, out)
		}
	}

	// A request over it is proxied.
	r, err := tlsRequest(addr, "/", clientTLS(t, demo.CA, "a.example.com"))
	if err != nil || r.Status != 200 || r.Body != "b1\n" {
		t.Errorf("GET / over TLS: %d %q, %v", r.Status, r.Body, err)
	}
	v := getStats(t, p)
	// Go and openssl each made 4 handshakes with the proxy, plus the request.
	if v["listener.web.ssl.handshake"] < 9 {
		t.Errorf("listener.web.ssl.handshake = %d, want at least 9", v["listener.web.ssl.handshake"])
	}
	if n := v["listener.web.ssl.no_certificate"]; n != 2 {
		t.Errorf("listener.web.ssl.no_certificate = %d, want 2 (one unknown name, by Go and by openssl)", n)
	}
}

// opensslSubject is the subject= line of s_client's output.
func opensslSubject(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "subject=") {
			return line
		}
	}
	return ""
}

// TestTLSResumptionAcrossHotRestart (issue 13): a client's session from
// epoch N resumes on epoch N+1, because the session-ticket keys went to
// the next generation with the listening sockets; ssl.session_reused
// counts it. TLS 1.3 and 1.2 (tickets differ: post-handshake in 1.3, in
// the handshake in 1.2).
func TestTLSResumptionAcrossHotRestart(t *testing.T) {
	for _, v := range []struct {
		name string
		max  uint16
	}{{"TLS1.3", tls.VersionTLS13}, {"TLS1.2", tls.VersionTLS12}} {
		t.Run(v.name, func(t *testing.T) {
			demo := harness.CopyDemoCerts(t)
			backend := harness.StartHTTPBackend(t, "b1")
			cfg := restartConfig("1s", "2s", "100ms", backend.Addr)
			cfg.Listeners[0] = tlsListener(demo.ListenerTLS())
			c := startChain(t, cfg)
			addr := c.serving.Addr("web")

			cc := clientTLS(t, demo.CA, "a.example.com")
			cc.MaxVersion = v.max
			cc.ClientSessionCache = tls.NewLRUClientSessionCache(8)
			epochOf := func(what string) tlsResponse {
				t.Helper()
				r, err := tlsRequest(addr, "/epoch", cc)
				if err != nil || r.Status != 200 {
					t.Fatalf("%s: GET /epoch: %d %q, %v", what, r.Status, r.Body, err)
				}
				if r.State.Version != v.max {
					t.Fatalf("%s: TLS version %x, want %x", what, r.State.Version, v.max)
				}
				return r
			}
			if r := epochOf("first handshake"); r.Body != "0" || r.State.DidResume {
				t.Fatalf("first handshake: epoch %q, resumed %v; want epoch 0, a full handshake", r.Body, r.State.DidResume)
			}
			// Within one generation first: if this fails, resumption is
			// broken altogether, not across the restart.
			if r := epochOf("second handshake, same epoch"); r.Body != "0" || !r.State.DidResume {
				t.Fatalf("second handshake on epoch 0: epoch %q, resumed %v; want a resumption on epoch 0", r.Body, r.State.DidResume)
			}
			// A ticket the client holds now came from epoch 0: its latest
			// resumed handshake gave it a fresh one, still from epoch 0.
			_, parent := c.restart()
			waitExit0(t, parent, exitTimeout) // from here on, only epoch 1 accepts
			g := c.serving.Proxy
			before := getStats(t, g)["listener.web.ssl.session_reused"]

			r := epochOf("after the hot restart")
			if r.Body != "1" {
				t.Fatalf("after the hot restart: answered by epoch %q, want 1", r.Body)
			}
			if !r.State.DidResume {
				t.Errorf("%s: the session from epoch 0 did not resume on epoch 1 (a full handshake): the session-ticket keys did not reach the next generation", v.name)
			}
			waitStatAtLeast(t, g, "listener.web.ssl.session_reused", before+1, 5*time.Second)
		})
	}
}

// TestTLSCertificateRotationUnderLoad (issue 13): a certificate replaced
// on disk (write, then rename) is served to new handshakes within a
// second, without a restart and without a failed request under TLS
// connection-per-request load; a broken replacement is refused and
// counted, and the certificate before it keeps serving.
func TestTLSCertificateRotationUnderLoad(t *testing.T) {
	ca := harness.NewCA(t, "rotation test CA")
	first := ca.Issue(t, "first", "a.example.com")
	// The files the proxy serves, in a directory of their own.
	dir := t.TempDir()
	served := harness.CertPair{Cert: filepath.Join(dir, "site.pem"), Key: filepath.Join(dir, "site.key")}
	certPEM, keyPEM := first.PEM(t)
	harness.ReplaceFile(t, served.Cert, certPEM)
	harness.ReplaceFile(t, served.Key, keyPEM)

	cfg := harness.Config{
		Concurrency: testConcurrency,
		Listeners: []harness.Listener{{
			Name:   "web",
			TLS:    &harness.ListenerTLS{Certificates: []harness.CertPair{served}},
			Routes: []harness.Route{{Prefix: "/", Status: 200, Body: "ok"}},
		}},
	}
	p := harness.Start(t, cfg)
	addr := p.Addr("web")
	cc := clientTLS(t, ca.File, "a.example.com")
	serial := func() string {
		t.Helper()
		st, err := handshakeLeaf(addr, cc)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		return st.PeerCertificates[0].SerialNumber.String()
	}
	if got := serial(); got != first.Leaf.SerialNumber.String() {
		t.Fatalf("at start: serial %s, want the first certificate's %s", got, first.Leaf.SerialNumber)
	}

	load := startSteadyLoad(t, loadgen.Options{
		URL: p.HTTPSURL("web", "/"), Mode: loadgen.ConnPerRequest, Clients: 4, Requests: 300,
		TLS: cc, Timeout: tlsTimeout,
		Check: func(_ *http.Response, body []byte) error {
			if string(body) != "ok" {
				return fmt.Errorf("body %q, want ok", body)
			}
			return nil
		},
	})
	load.WaitMore(t, 100)

	// A good rotation: same name and key, a new serial.
	second := ca.Reissue(t, "second", first)
	newPEM, _ := second.PEM(t)
	reloadsBefore := getStats(t, p)["listener.web.ssl.certificate_reload"]
	renamed := time.Now()
	harness.ReplaceFile(t, served.Cert, newPEM)
	want := second.Leaf.SerialNumber.String()
	var took time.Duration
	for {
		if serial() == want {
			took = time.Since(renamed)
			break
		}
		if time.Since(renamed) > 10*time.Second {
			t.Fatalf("the replaced certificate (serial %s) not served 10s after the rename", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the new certificate served %v after the rename", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the new certificate was served %v after the rename, want within 1s", took)
	}
	waitStatAtLeast(t, p, "listener.web.ssl.certificate_reload", reloadsBefore+1, 5*time.Second)
	load.WaitMore(t, 100)

	// A broken replacement: refused, counted, the second one still served.
	failedBefore := getStats(t, p)["listener.web.ssl.certificate_reload_failed"]
	harness.ReplaceFile(t, served.Cert, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"))
	waitStatAtLeast(t, p, "listener.web.ssl.certificate_reload_failed", failedBefore+1, 5*time.Second)
	for i := 0; i < 5; i++ {
		if got := serial(); got != want {
			t.Fatalf("after a broken replacement: serial %s, want the previous certificate's %s", got, want)
		}
	}
	load.WaitMore(t, 100)
	res := load.Stop()
	t.Logf("load: %v", res)
	if res.Failed() != 0 {
		t.Errorf("%d requests failed across the rotations: %v", res.Failed(), res)
	}
	if p.Exited() {
		t.Fatalf("hotproxy exited\n%s", p.Output())
	}
}

// TestTLSReloadStorm (issue 13): hot restarts every 100 to 200 ms under
// TLS keep-alive and TLS connection-per-request load, each client with a
// session cache. No request fails, and since the session-ticket keys pass
// from generation to generation, clients resume rather than make full
// handshakes after each reload: the full vs resumed handshakes of each
// reload interval are logged, and the full ones stay at what the clients'
// first connections needed.
func TestTLSReloadStorm(t *testing.T) {
	const reloads, clients = 20, 4
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1")
	cfg := restartConfig("1s", "2s", "100ms", backend.Addr)
	cfg.Listeners[0] = tlsListener(demo.ListenerTLS())
	c := startChain(t, cfg)
	url := c.serving.HTTPSURL("web", "/")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	modes := []loadgen.Mode{loadgen.KeepAlive, loadgen.ConnPerRequest}
	runs := make([]*loadgen.Run, len(modes))
	for i, mode := range modes {
		r, err := loadgen.Start(ctx, loadgen.Options{
			URL: url, Mode: mode, Clients: clients, Duration: 2 * time.Minute, Timeout: tlsTimeout,
			TLS: clientTLS(t, demo.CA, "a.example.com"), SessionCache: true, Check: backendCheck("b1"),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		if !r.WaitTotal(100, 10*time.Second) {
			t.Fatalf("%v load did not start: %v", mode, r.Snapshot())
		}
		if res := r.Snapshot(); res.Failed() != 0 {
			t.Fatalf("TLS %v load fails before any reload: %v", mode, res)
		}
		runs[i] = r
	}
	snap := func() [2]loadgen.Result { return [2]loadgen.Result{runs[0].Snapshot(), runs[1].Snapshot()} }
	atStart := snap()

	var fullDuring [2]int64
	prev := atStart
	start := time.Now()
	next := start
	for i := 1; i <= reloads; i++ {
		// 100, 200, 100, ... ms apart: pacing, not synchronisation.
		next = next.Add(time.Duration(100+100*(i%2)) * time.Millisecond)
		child, _ := c.restart()
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		now := snap()
		line := fmt.Sprintf("reload %2d (epoch %d):", i, child.Epoch)
		for m := range modes {
			full := now[m].FullHandshakes - prev[m].FullHandshakes
			resumed := now[m].ResumedHandshakes - prev[m].ResumedHandshakes
			fullDuring[m] += full
			line += fmt.Sprintf("  %s: %d full, %d resumed, %d failed", modes[m], full, resumed, now[m].Failed()-prev[m].Failed())
		}
		t.Log(line)
		prev = now
	}
	t.Logf("%d reloads in %v", reloads, time.Since(start).Round(time.Millisecond))

	for m, r := range runs {
		r.WaitTotal(r.Snapshot().Total()+100, 10*time.Second)
		res := r.Stop()
		t.Logf("TLS %v: %v", modes[m], res)
		if res.Failed() != 0 {
			t.Errorf("TLS %v: %d failed requests: %v", modes[m], res.Failed(), res)
		}
		if res.ResumedHandshakes == 0 {
			t.Errorf("TLS %v: no handshake resumed at all: %v", modes[m], res)
		}
		// Without the keys handed over, every client would do a full
		// handshake after every reload (reloads*clients of them).
		if fullDuring[m] > clients {
			t.Errorf("TLS %v: %d full handshakes during %d reloads with %d clients, want at most %d: sessions did not resume across reloads",
				modes[m], fullDuring[m], reloads, clients, clients)
		}
	}
	for _, g := range c.gens[:len(c.gens)-1] {
		if code, err := g.Wait(exitTimeout); err != nil || code != 0 {
			t.Errorf("epoch %d (pid %d): exit %d, %v", g.Epoch, g.PID(), code, err)
		}
	}
}

// TestHTTP2ALPN (issue 13): ALPN h2 on a TLS listener is served as HTTP/2
// (curl --http2 and a Go client say so) and proxied to an HTTP/1.1
// backend.
func TestHTTP2ALPN(t *testing.T) {
	demo := harness.CopyDemoCerts(t)
	backend := harness.StartHTTPBackend(t, "b1") // HTTP/1.1 only: no TLS, no h2c
	cfg := httpProxyConfig(backend.Addr)
	cfg.Listeners[0] = tlsListener(demo.ListenerTLS())
	p := harness.Start(t, cfg)
	port := p.Addr("web")[strings.LastIndexByte(p.Addr("web"), ':')+1:]
	url := "https://a.example.com:" + port + "/"

	out, err := exec.Command("curl", "--http2", "--cacert", demo.CA, "--resolve", "a.example.com:"+port+":127.0.0.1",
		"-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_version}", url).CombinedOutput()
	if err != nil {
		t.Fatalf("curl --http2: %v\n%s", err, out)
	}
	body, version, _ := strings.Cut(string(out), "\n\n")
	if version != "2" || body != "b1" {
		t.Errorf("curl --http2: HTTP version %q, body %q; want 2 and the backend's b1\n%s", version, body, out)
	}

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: nil, ForceAttemptHTTP2: true,
		TLSClientConfig: clientTLS(t, demo.CA, "a.example.com"),
	}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		path string
		want int
	}{{"/", 200}, {"/status?code=201", 201}} {
		resp, err := client.Get("https://" + p.Addr("web") + tc.path)
		if err != nil {
			t.Fatalf("Go client, h2, GET %s: %v", tc.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
			t.Errorf("Go client GET %s: %s, want HTTP/2 over ALPN h2", tc.path, resp.Proto)
		}
		if resp.StatusCode != tc.want || string(b) != "b1\n" || resp.Header.Get(harness.HeaderBackendID) != "b1" {
			t.Errorf("Go client GET %s: %s %q, want %d and the backend's answer", tc.path, resp.Status, b, tc.want)
		}
	}
	if n := backend.Requests(); n != 3 {
		t.Errorf("the backend saw %d requests, want 3 (curl's, and the Go client's 2)", n)
	}
	if n := getStats(t, p)["listener.web.ssl.alpn.h2"]; n < 2 {
		t.Errorf("listener.web.ssl.alpn.h2 = %d, want at least 2 (curl and the Go client)", n)
	}

	// HTTP/1.1 still, for a client that offers only it.
	r, err := tlsRequest(p.Addr("web"), "/", clientTLS(t, demo.CA, "a.example.com"))
	if err != nil || r.Status != 200 || r.Body != "b1\n" {
		t.Errorf("HTTP/1.1 over TLS: %d %q, %v", r.Status, r.Body, err)
	}
}

// TestUpstreamTLS (issue 13): a cluster with [clusters.tls] verifies its
// upstream against a test CA and proxies over TLS, keeping the
// connection in its pool; against a CA that did not sign the upstream's
// certificate it answers 502 and counts cluster.<name>.ssl.connection_error.
func TestUpstreamTLS(t *testing.T) {
	ca := harness.NewCA(t, "upstream test CA")
	other := harness.NewCA(t, "some other CA")
	cert := ca.Issue(t, "backend", "backend.internal")
	backend := harness.StartTLSBackend(t, "tb", &tls.Config{Certificates: []tls.Certificate{cert.TLS}})

	cfg := harness.Config{
		Concurrency: testConcurrency,
		Listeners: []harness.Listener{
			{Name: "good", Routes: []harness.Route{{Prefix: "/", Cluster: "secure"}}},
			{Name: "bad", Routes: []harness.Route{{Prefix: "/", Cluster: "wrongca"}}},
		},
		Clusters: []harness.Cluster{
			{Name: "secure", Endpoints: []string{backend.Addr}, ConnectTimeout: "1s",
				TLS: &harness.ClusterTLS{CA: ca.File, ServerName: "backend.internal"}},
			{Name: "wrongca", Endpoints: []string{backend.Addr}, ConnectTimeout: "1s",
				TLS: &harness.ClusterTLS{CA: other.File, ServerName: "backend.internal"}},
		},
	}
	p := harness.Start(t, cfg)
	client := newClient(10 * time.Second)
	defer client.CloseIdleConnections()

	const n = 10
	for i := 0; i < n; i++ {
		resp, body := get(t, client, p.URL("good", "/"))
		if resp.StatusCode != 200 || body != "tb\n" {
			t.Fatalf("request %d through the TLS cluster: %s %q, want 200 from the TLS backend", i, resp.Status, body)
		}
	}
	conns := map[string]bool{}
	for _, s := range backend.Seen() {
		conns[s.RemoteAddr] = true
	}
	if len(conns) > testConcurrency {
		t.Errorf("%d requests came on %d upstream TLS connections, want at most %d (one pool per worker, kept alive)", n, len(conns), testConcurrency)
	}
	v := getStats(t, p)
	if v["cluster.secure.ssl.handshake"] < 1 || v["cluster.secure.ssl.connection_error"] != 0 {
		t.Errorf("cluster.secure.ssl: handshake %d, connection_error %d; want at least 1 and 0",
			v["cluster.secure.ssl.handshake"], v["cluster.secure.ssl.connection_error"])
	}

	seenBefore := backend.Requests()
	resp, body := get(t, client, p.URL("bad", "/"))
	// An endpoint whose certificate does not verify is one that cannot
	// be connected to: 503, like any connect failure (as Envoy answers).
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "TLS handshake failed") {
		t.Errorf("through the cluster with the wrong CA: %s %q, want 503 naming the TLS handshake", resp.Status, body)
	}
	if backend.Requests() != seenBefore {
		t.Errorf("a request reached the backend over a connection that did not verify")
	}
	waitStatAtLeast(t, p, "cluster.wrongca.ssl.connection_error", 1, 5*time.Second)
}

// TestTLSPassthroughBySNI (issue 13): a tcp listener with sni_routes sends
// each TLS connection, untouched, to the cluster its ClientHello's SNI
// names: the client completes its handshake with the backend itself and
// sees that backend's own certificate. A name no route holds, on a
// listener without a default cluster, is closed.
func TestTLSPassthroughBySNI(t *testing.T) {
	ca := harness.NewCA(t, "passthrough test CA")
	certs := map[string]harness.Issued{}
	backends := map[string]*harness.HTTPBackend{}
	for _, name := range []string{"db1", "db2"} {
		certs[name] = ca.Issue(t, name, name+".example.com")
		backends[name] = harness.StartTLSBackend(t, name, &tls.Config{Certificates: []tls.Certificate{certs[name].TLS}})
	}
	cfg := harness.Config{
		Concurrency: testConcurrency,
		Listeners: []harness.Listener{{
			Name: "pass", Protocol: "tcp",
			SNIRoutes: []harness.SNIRoute{
				{ServerNames: []string{"db1.example.com"}, Cluster: "db1"},
				{ServerNames: []string{"db2.example.com"}, Cluster: "db2"},
			},
		}},
		Clusters: []harness.Cluster{
			{Name: "db1", Endpoints: []string{backends["db1"].Addr}, ConnectTimeout: "1s"},
			{Name: "db2", Endpoints: []string{backends["db2"].Addr}, ConnectTimeout: "1s"},
		},
	}
	p := harness.Start(t, cfg)
	addr := p.Addr("pass")
	for _, name := range []string{"db1", "db2", "db1"} {
		cc := &tls.Config{RootCAs: ca.Pool(), ServerName: name + ".example.com"}
		r, err := tlsRequest(addr, "/", cc)
		if err != nil {
			t.Fatalf("SNI %s.example.com: %v", name, err)
		}
		leaf := r.State.PeerCertificates[0]
		if leaf.SerialNumber.Cmp(certs[name].Leaf.SerialNumber) != 0 {
			t.Errorf("SNI %s.example.com: certificate %v serial %s, want the backend's own (serial %s)",
				name, leaf.DNSNames, leaf.SerialNumber, certs[name].Leaf.SerialNumber)
		}
		if r.Status != 200 || r.Body != name+"\n" {
			t.Errorf("SNI %s.example.com: %d %q, want the answer of backend %s", name, r.Status, r.Body, name)
		}
	}
	cc := &tls.Config{RootCAs: ca.Pool(), ServerName: "db3.example.com"}
	if r, err := tlsRequest(addr, "/", cc); err == nil {
		t.Errorf("SNI db3.example.com (no route, no default cluster): answered %d %q, want the connection closed", r.Status, r.Body)
	}
}
