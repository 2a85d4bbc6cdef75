package integration

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/integration/harness"
	"github.com/hotproxy/hotproxy/integration/loadgen"
)

// tlsTimeout bounds each handshake and request of the TLS tests.
const tlsTimeout = 5 * time.Second

// clientTLS is a client config trusting only caFile, sending serverName.
func clientTLS(t testing.TB, caFile, serverName string) *tls.Config {
	t.Helper()
	c, err := loadgen.ClientTLS(caFile, serverName)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsResponse is what one request on a fresh TLS connection got.
type tlsResponse struct {
	Status int
	Body   string
	State  tls.ConnectionState
}

// tlsRequest opens a TLS connection to addr with tc, sends GET path with
// Connection: close, and reads the whole response (which also reads any
// TLS 1.3 session ticket the server sent, so tc's session cache has it).
func tlsRequest(addr, path string, tc *tls.Config) (tlsResponse, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: tlsTimeout}, "tcp", addr, tc)
	if err != nil {
		return tlsResponse{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(tlsTimeout))
	host := tc.ServerName
	if host == "" {
		host = "localhost"
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host); err != nil {
		return tlsResponse{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return tlsResponse{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return tlsResponse{}, err
	}
	return tlsResponse{Status: resp.StatusCode, Body: string(body), State: conn.ConnectionState()}, nil
}

// handshakeLeaf completes a handshake with addr and returns the leaf
// certificate the server showed.
func handshakeLeaf(addr string, tc *tls.Config) (*tls.ConnectionState, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: tlsTimeout}, "tcp", addr, tc)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st := conn.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return nil, fmt.Errorf("%s: no certificate in the handshake", addr)
	}
	return &st, nil
}

// tlsListener is an http listener "web" terminating TLS with tlsCfg:
// /epoch answers the serving generation's epoch, / goes to "backend".
func tlsListener(tlsCfg *harness.ListenerTLS) harness.Listener {
	return harness.Listener{
		Name: "web",
		TLS:  tlsCfg,
		Routes: []harness.Route{
			{Path: "/epoch", Status: 200, Body: "%EPOCH%"},
			{Prefix: "/", Cluster: "backend"},
		},
	}
}
