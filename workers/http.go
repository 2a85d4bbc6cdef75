package workers

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/server/config"
	"github.com/hotproxy/hotproxy/upstream"
)

// httpErrorLog routes net/http's and ReverseProxy's own log lines (bad TLS,
// superfluous WriteHeader, body copy errors) to the workers logger at
// debug: they describe one client's misbehaviour, not the proxy's health.
type httpErrorLog struct{ l *log.Logger }

func newHTTPErrorLog(l hclog.Logger) *httpErrorLog {
	return &httpErrorLog{l: l.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
}

func (m *Manager) newHTTPServer(l *config.Listener, wk *worker, li int) *http.Server {
	headerTimeout := l.HeaderTimeout.D()
	if headerTimeout <= 0 {
		headerTimeout = config.DefaultHeaderTimeout
	}
	idle := l.IdleTimeout.D()
	if idle <= 0 {
		idle = config.DefaultHTTPIdleTimeout
	}
	maxHeader := l.MaxHeaderBytes
	if maxHeader <= 0 {
		maxHeader = config.DefaultMaxHeaderBytes
	}
	return &http.Server{
		// The handler is this worker's: per-worker state needs no
		// lookup.
		Handler:           &httpHandler{m: m, wk: wk, li: li, st: wk.stats[li]},
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idle,
		MaxHeaderBytes:    maxHeader,
		ErrorLog:          m.httpLog.l,
		ConnState: func(c net.Conn, st http.ConnState) {
			if tc, ok := c.(*trackedConn); ok {
				tc.setState(st)
			}
		},
	}
}

// httpHandler serves one listener for one worker.
type httpHandler struct {
	m  *Manager
	wk *worker
	li int
	st *listenerStats
}

var _ http.Handler = (*httpHandler)(nil)

const noRouteBody = "no route matched\n"

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h.st.rqTotal.Inc()
	h.st.rqActive.Inc()
	// Deferred first, so it runs last: the request's final stat write.
	defer h.st.rqActive.Dec()
	defer h.st.requestDone(start)
	if h.m.draining.Load() {
		// The client reconnects for its next request, to whoever
		// accepts then, instead of finding this connection closed
		// under it.
		w.Header().Set("Connection", "close")
	}
	lv := h.wk.view.Load().listeners[h.li]
	var rt *route
	if lv != nil {
		rt = lv.match(r.Host, r.URL.Path)
	}
	switch {
	case rt == nil:
		h.st.status(http.StatusNotFound)
		writeText(w, http.StatusNotFound, noRouteBody)
	case rt.direct != nil:
		h.st.status(rt.direct.status)
		rt.direct.write(w)
	default:
		h.proxy(w, r, lv, rt)
	}
}

// exchange is one proxied request: the context of the upstream exchange
// (it is a context.Context itself, one allocation for both), the request
// timeout, and the status sent.
type exchange struct {
	context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	status int
}

type exchangeKey struct{}

func (e *exchange) Value(key any) any {
	if key == (exchangeKey{}) {
		return e
	}
	return e.Context.Value(key)
}

func exchangeOf(ctx context.Context) *exchange {
	e, _ := ctx.Value(exchangeKey{}).(*exchange)
	return e
}

func (e *exchange) timeout() { e.cancel(errRequestTimeout) }

// errRequestTimeout is the cause of an exchange cut by request_timeout.
var errRequestTimeout = errors.New("request_timeout elapsed before the upstream's response headers")

func (h *httpHandler) proxy(w http.ResponseWriter, r *http.Request, lv *listenerView, rt *route) {
	// request_timeout bounds the request up to the upstream's response
	// headers (config: "from its first byte to the end of the response
	// headers"). A context deadline would also cut a long streaming
	// body and an upgraded connection, so it is a timer that
	// ModifyResponse stops when the headers arrive.
	ctx, cancel := context.WithCancelCause(r.Context())
	ex := &exchange{Context: ctx, cancel: cancel}
	ex.timer = time.AfterFunc(lv.requestTimeout, ex.timeout)
	defer func() {
		ex.timer.Stop()
		cancel(nil)
		h.st.status(ex.status)
	}()
	// A proxy streams the response while the request body may still
	// be arriving: without this, net/http would swallow the rest of the
	// request body when the response starts.
	if r.Body != http.NoBody {
		http.NewResponseController(w).EnableFullDuplex()
	}
	lv.proxies[rt.index].ServeHTTP(w, r.WithContext(ex))
}

// newReverseProxy is worker w's proxy to one cluster.
func (m *Manager) newReverseProxy(wc *upstream.WorkerCluster) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:   rewrite,
		Transport: wc.RoundTripper(),
		// 0: ReverseProxy flushes after every write anyway for
		// text/event-stream and for bodies of unknown length (chunked,
		// streaming); known-length bodies go through the server's
		// buffer, fewer syscalls. -1 would flush every 32 KiB chunk of
		// a large download for nothing.
		FlushInterval:  0,
		BufferPool:     bufferPool{},
		ErrorLog:       m.httpLog.l,
		ModifyResponse: m.modifyResponse,
		ErrorHandler:   m.proxyError,
	}
}

func rewrite(pr *httputil.ProxyRequest) {
	// The upstream RoundTripper picks the endpoint and sets the URL's
	// scheme and host; the client's Host header is kept.
	pr.Out.Host = pr.In.Host
	// ReverseProxy dropped the client's X-Forwarded-*; keep its
	// X-Forwarded-For chain and append the client's address to it.
	if prior := pr.In.Header["X-Forwarded-For"]; len(prior) > 0 {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	pr.SetXForwarded()
	if _, ok := pr.In.Header["X-Request-Id"]; !ok {
		pr.Out.Header["X-Request-Id"] = []string{newRequestID()}
	}
}

// newRequestID is 16 random bytes in hex. Not a secret: math/rand is
// enough and does not lock.
func newRequestID() string {
	var b [16]byte
	var out [32]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	hex.Encode(out[:], b[:])
	return string(out[:])
}

// modifyResponse runs when the upstream's response headers arrive: the
// request timeout no longer applies.
func (m *Manager) modifyResponse(res *http.Response) error {
	if m.draining.Load() && res.StatusCode != http.StatusSwitchingProtocols {
		// The request may have begun before the drain; its response is
		// still the last on this connection. ReverseProxy has removed
		// the upstream's own Connection header by now.
		res.Header.Set("Connection", "close")
	}
	if res.Request == nil {
		return nil
	}
	ex := exchangeOf(res.Request.Context())
	if ex == nil {
		return nil
	}
	if !ex.timer.Stop() {
		// The timer fired: the exchange is already cancelled.
		return errRequestTimeout
	}
	ex.status = res.StatusCode
	return nil
}

// proxyError answers a request whose upstream exchange failed before the
// response headers were sent.
func (m *Manager) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	ex := exchangeOf(r.Context())
	status, body := classify(err, ex)
	if ex != nil {
		ex.status = status
		if ex.Err() != nil && context.Cause(ex) != errRequestTimeout {
			// The client went away: nobody reads this answer, and
			// it says nothing about the upstream.
			ex.status = 0
		}
	}
	if m.log.IsDebug() {
		m.log.Debug("upstream request failed", "method", r.Method, "host", r.Host, "path", r.URL.Path, "status", status, "error", err)
	}
	writeText(w, status, body)
}

// classify maps an upstream exchange error to a status and a short body:
// 503 when no upstream took the request (it is safe to retry), 504 on a
// timeout, 502 for anything else.
func classify(err error, ex *exchange) (int, string) {
	var ce *upstream.ConnectError
	switch {
	case ex != nil && context.Cause(ex) == errRequestTimeout, errors.Is(err, errRequestTimeout):
		return http.StatusGatewayTimeout, "upstream timeout\n"
	case errors.As(err, &ce):
		return http.StatusServiceUnavailable, "upstream connect error: " + dialReason(ce.Err) + "\n"
	case errors.Is(err, upstream.ErrNoEndpoint):
		return http.StatusServiceUnavailable, "upstream connect error: no healthy upstream endpoint\n"
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return http.StatusGatewayTimeout, "upstream timeout\n"
	}
	return http.StatusBadGateway, "upstream error\n"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dialReason is a connect error in a few words, without addresses.
func dialReason(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "connect failed"
	case isTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return "connect timeout"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return "connect failed"
}

func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	w.WriteHeader(status)
	io.WriteString(w, body)
}
