package httpfront

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
)

// The seam between the worker and the front end. The worker builds, once:
// an Env for its Manager, a Worker per worker, a Listener per worker and
// http listener (with the Host that answers for the worker), and hands
// each accepted connection to NewConn. Nothing here is built per
// connection or per request.

// Env is what every HTTP connection of one Manager shares.
type Env struct {
	// Ctx is the Manager's: it bounds upstream dials, and its end
	// closes the HTTP/2 upstream pools.
	Ctx context.Context
	Log hclog.Logger
	// OverloadPass is the overload manager's pass count, the clock of
	// a connection's buffer holding (Conn.HeldBuffers).
	OverloadPass *atomic.Int64
	// GRPCToHTTP1 warns, rate-limited, of gRPC requests routed to a
	// cluster that speaks HTTP/1.1.
	GRPCToHTTP1 *ratelog.Limiter

	h2 h2State
}

// Worker is the front end's state of one worker, owned by it (the worker
// embeds it): its connections' buffers, its idle poller, what the
// overload manager asks of it now.
type Worker struct {
	// Bufs counts the buffers its HTTP/1.1 connections hold, for the
	// worker's reclaimer.
	Bufs BufHolding
	// Overload is what the overload manager asks now (nil: nothing),
	// loaded once per request start (and by the worker, at accept).
	Overload atomic.Pointer[Overload]
	// idle parks idle plaintext keep-alive connections
	// (idlepoll_linux.go); closed by CloseIdlePoller.
	idle idlePoller
}

// CloseIdlePoller stops the worker's idle poller (the worker's last
// close: every connection is closed already).
func (w *Worker) CloseIdlePoller() { w.idle.close() }

// Listener is one http listener as one worker serves it, fixed for the
// listener's life in its Manager (a socket outlives snapshots; routes do
// not: View). A listener whose settings change is served by a new
// Listener; the old one's connections finish, draining.
type Listener struct {
	Env    *Env
	Worker *Worker
	Host   Host
	Name   string
	Stats  *Stats
	// Draining makes every HTTP/1.1 response carry "Connection: close"
	// (an HTTP/2 connection gets the graceful GOAWAY: GoAwayHTTP2,
	// GoAwayHTTP2Of). Shared by the listener's Listeners on every
	// worker: the whole Manager drains (a hot restart), or this
	// listener alone (removed or changed in process).
	Draining *atomic.Bool
	// ConnWG counts the goroutines of the listener's HTTP connections:
	// the worker adds one before it serves a connection (Conn.Serve),
	// the connection's end takes it off. Shared like Draining.
	ConnWG *sync.WaitGroup
	// Settings are the listener's own HTTP/1.1 settings; a connection
	// may run on a shrunk copy while overload asks (Overload.Settings).
	Settings *Settings
	// Index is the listener's index in the Manager: Overload.Settings's.
	Index int
	// H2 is the HTTP/2 engine's configuration (H2ServerConfig).
	H2 *h2.ServerConfig
	// HTTP2Cleartext: a connection that opens with the HTTP/2 preface
	// is served as HTTP/2 (h2c with prior knowledge).
	HTTP2Cleartext bool
	// TLS terminates TLS on the listener's connections (nil: plaintext);
	// the handshake is the Host's.
	TLS        *tls.Config
	AccessLogs []*accesslog.Logger
}

// Host is what the front end asks of the worker that runs a listener's
// connections (package workers implements it). Its methods allocate
// nothing.
type Host interface {
	// View is the listener's routing on this worker now: loaded once
	// per request (the snapshot may change between two).
	View() *View
	// Handshake runs the TLS handshake of tc over sock, bounded and
	// counted by the worker.
	Handshake(tc *tls.Conn, sock net.Conn) (tls.ConnectionState, error)
	// Closed gives back what accept took for c (its place in the
	// connection set, its connection slot, the connection gauges); once.
	Closed(c *Conn)
	// RequestRefused counts a request the overload manager's
	// refuse_requests answered 503.
	RequestRefused()
}

// View is one snapshot's routing of an http listener, for one worker:
// built by the worker at publish, read by every request until the next.
type View struct {
	Routes route.Table
	// Clusters are the worker's clusters, by route index (nil: a direct
	// response).
	Clusters []*upstream.WorkerCluster
	// H2Upstreams are how the snapshot's clusters that speak HTTP/2 are
	// spoken to, by cluster name.
	H2Upstreams map[string]upstream.H2PoolOptions
}

// Overload is one published state of the overload manager, with what the
// request path needs of it built once (NewOverloadRefusal).
type Overload struct {
	// StopAccepting: the worker closes new connections at accept.
	StopAccepting bool
	// RefuseRequests answers new requests 503 with Retry-After;
	// DisableKeepAlive closes HTTP/1.1 connections after their response
	// and sends HTTP/2 ones a GOAWAY.
	RefuseRequests, DisableKeepAlive bool
	// Refusal is the whole HTTP/1.1 503 response; RetryAfter the
	// Retry-After value, for HTTP/2.
	Refusal    []byte
	RetryAfter []string
	// Settings are the shrunk settings of every http listener, by
	// Listener.Index (nil: timeouts as configured).
	Settings []*Settings
}
