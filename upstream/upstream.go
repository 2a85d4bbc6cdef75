// Package upstream is where proxied traffic goes: clusters of endpoints,
// the load balancers that choose among them, and each worker's connection
// pools to them.
//
// A Cluster is built once by the main thread from config and is immutable.
// Each worker takes its own view with ForWorker; a view's balancer state and
// keep-alive pool belong to that worker alone, so workers never share
// mutable state (DESIGN §3).
package upstream

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/hotproxy/hotproxy/server/config"
)

// ErrNoEndpoint: the cluster has no endpoint that can take the request.
var ErrNoEndpoint = errors.New("no healthy upstream endpoint")

// ConnectError is returned when every endpoint tried refused or timed out
// at connect; the request never reached an upstream, so it is safe to say
// 503 to the client.
type ConnectError struct {
	Cluster string
	Tried   []string // endpoint addresses, in the order tried
	Err     error    // the last dial error
}

func (e *ConnectError) Error() string { panic("contract: implement in upstream") }
func (e *ConnectError) Unwrap() error { return e.Err }

// Cluster is a built, immutable cluster.
type Cluster struct {
	Name      string
	Endpoints []Endpoint
}

// Endpoint is one resolved upstream address ("ip:port").
type Endpoint struct {
	Address string
}

// NewCluster builds a cluster from its spec: resolves every endpoint (an
// unresolvable name is an error naming the cluster and the endpoint),
// chooses the balancer.
func NewCluster(spec config.Cluster) (*Cluster, error) { panic("contract") }

// ForWorker returns worker w's view of the cluster. Called once per worker
// when a snapshot is built; the view is used only by that worker.
func (c *Cluster) ForWorker(w int) *WorkerCluster { panic("contract") }

// WorkerCluster is one worker's view of a cluster: its balancer state, its
// keep-alive pool.
type WorkerCluster struct{}

// DialTCP picks an endpoint with the balancer and connects within the
// cluster's connect timeout, trying the next endpoint when one fails.
// done must be called when the connection is finished with (least_request
// counts active connections with it).
func (wc *WorkerCluster) DialTCP(ctx context.Context) (conn net.Conn, endpoint string, done func(), err error) {
	panic("contract")
}

// RoundTripper sends HTTP requests to the cluster: balancer pick per
// request, the next endpoint when a connect fails (the request body is not
// lost: nothing of it was sent), keep-alive connections pooled per endpoint
// for this worker.
func (wc *WorkerCluster) RoundTripper() http.RoundTripper { panic("contract") }

// CloseIdle closes this worker's idle pooled connections (drain, or a
// snapshot that no longer has this cluster).
func (wc *WorkerCluster) CloseIdle() { panic("contract") }
