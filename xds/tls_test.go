package xds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// issue makes a certificate for cn signed by parent (self-signed when
// parent is nil).
func issue(tb testing.TB, cn string, parent *tls.Certificate, isCA bool, usage x509.ExtKeyUsage) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		tb.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// The control plane over TLS with a client certificate, as [xds] reaches
// a static cluster with TLS.
func TestControlPlaneOverMutualTLS(t *testing.T) {
	ca := issue(t, "test CA", nil, true, x509.ExtKeyUsageAny)
	serverCert := issue(t, "control plane", &ca, false, x509.ExtKeyUsageServerAuth)
	clientCert := issue(t, "proxy-1", &ca, false, x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Leaf)

	var mu sync.Mutex
	var peers []string
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			mu.Lock()
			defer mu.Unlock()
			peers = append(peers, cs.PeerCertificates[0].Subject.CommonName)
			return nil
		},
	}
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	snap, err := cachev3.NewSnapshot("1", resources(t, "127.0.0.1:9001"))
	if err != nil {
		t.Fatal(err)
	}
	cache.SetSnapshot(context.Background(), testNode, snap)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), cache, nil))
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	cp := &controlPlane{addr: lis.Addr().String()}
	c, _ := startClient(t, cp, ProtocolDelta, func(cfg *Config) {
		cfg.Dial = DialTarget(cp.addr, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}, ServerName: "127.0.0.1"})
	})
	u := nextUpdate(t, c, 10*time.Second)
	if got := endpointsOf(u.State, "backend"); !slices.Equal(got, []string{"127.0.0.1:9001"}) {
		t.Fatalf("endpoints over TLS: %v", got)
	}
	u.Done(nil)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(peers, "proxy-1") {
		t.Errorf("the control plane saw client certificates %q, want proxy-1's", peers)
	}
}
