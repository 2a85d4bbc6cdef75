package server

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/ratelog"
	"github.com/hotproxy/hotproxy/internal/version"
)

// adminEndpoints lists the admin API; the index page shows it. Method
// patterns make the mux answer 405 (with Allow) for a wrong method.
var adminEndpoints = []struct{ pattern, help string }{
	{"GET /ready", "200 while this generation serves, 503 otherwise"},
	{"GET /server_info", "version, state, epoch, pid, uptimes (JSON)"},
	{"GET /config_dump", "the effective configuration, then its static (file) and dynamic (xDS) resources with versions and update times; key material redacted (JSON)"},
	{"GET /stats", "every stat of this base-id, all generations: name: value (?filter=REGEX, ?usedonly, ?format=json)"},
	{"GET /stats/prometheus", "the same in the Prometheus text format: hotproxy_ names, listener/cluster labels, seconds, classic le histograms (?filter=REGEX, ?usedonly, ?format=vmrange for VictoriaMetrics buckets)"},
	{"GET /clusters", "every cluster's endpoints: health check, ejection, counters (?format=json)"},
	{"GET /overload", "the overload manager: each monitor's pressure, each action's state, heap peaks, stop_accepting's mode (kernel or accept) (JSON)"},
	{"POST /healthcheck/fail", "make /ready answer 503 (take this instance out of rotation)"},
	{"POST /healthcheck/ok", "undo /healthcheck/fail"},
	{"POST /tls/reload", "read every TLS certificate/key pair again now, as SIGUSR2 (JSON; 422 names those refused, whose old pair serves on)"},
	{"POST /quitquitquit", "drain and exit"},
}

// adminListener is the admin socket as one generation sees it. A
// generation that hands over stops accepting on it, and keeps answering
// the connections it already accepted, while the successor accepts on the
// same socket.
type adminListener struct {
	net.Listener
	stopped atomic.Bool
}

func (l *adminListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && l.stopped.Load() {
		return nil, net.ErrClosed
	}
	return c, err
}

// stopAccepting wakes the accept loop with a deadline instead of closing
// the socket: connections queued in it are the successor's.
func (l *adminListener) stopAccepting() {
	l.stopped.Store(true)
	if d, ok := l.Listener.(interface{ SetDeadline(time.Time) error }); ok {
		d.SetDeadline(time.Now())
	}
}

// closeAdmin ends an admin server: requests in flight get a moment to
// finish.
func closeAdmin(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	handlers := map[string]http.HandlerFunc{
		"GET /ready":             s.handleReady,
		"GET /server_info":       s.handleServerInfo,
		"GET /config_dump":       s.handleConfigDump,
		"GET /stats":             s.handleStats,
		"GET /stats/prometheus":  s.handleStatsPrometheus,
		"GET /clusters":          s.handleClusters,
		"GET /overload":          s.handleOverload,
		"POST /healthcheck/fail": s.handleHealthcheck(true),
		"POST /healthcheck/ok":   s.handleHealthcheck(false),
		"POST /tls/reload":       s.handleTLSReload,
		"POST /quitquitquit":     s.handleQuit,
	}
	// Refusals are what a hostile web page can cause at will: logged at
	// most once per interval.
	refused := &ratelog.Limiter{Log: s.log.Named("admin")}
	guard := crossSiteGuard{loopbackOnly: !s.cfg.Admin.AllowRemote}
	if !s.cfg.Admin.Loopback() {
		s.log.Warn("the admin API listens beyond loopback ([admin] allow_remote = true); it has no authentication and can drain and stop the proxy: restrict who can reach it",
			"address", s.cfg.Admin.Address)
	}
	for _, e := range adminEndpoints {
		h := handlers[e.pattern]
		if strings.HasPrefix(e.pattern, "POST ") {
			h = guard.mutating(h, refused)
		}
		mux.HandleFunc(e.pattern, h)
	}
	mux.HandleFunc("GET /{$}", handleIndex)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.State() != StateLive {
			// This generation is on its way out: the client's next
			// request goes to whoever accepts then.
			w.Header().Set("Connection", "close")
		}
		if msg := guard.checkHost(r); msg != "" {
			refuse(w, r, msg, refused)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// crossSiteGuard keeps web pages off the admin API (issue 8, item 13). A
// browser sends a "simple" cross-origin request (a POST of a form or of
// text/plain, or with no body at all) without asking the server first,
// so any page a user of this host visits could POST /quitquitquit to
// 127.0.0.1:9901. Mutating endpoints are POST only (the mux answers 405
// to anything else) and refuse what only a browser sends cross-site; the
// tools that operate the proxy (curl -X POST, the harness, scripts) send
// no Origin, no Sec-Fetch-Site and no body, and pass.
type crossSiteGuard struct {
	// loopbackOnly: the admin API listens on loopback only (no
	// [admin] allow_remote), so a request naming it by a DNS name is a
	// page that rebound its own name to 127.0.0.1.
	loopbackOnly bool
}

// simpleContentTypes are the media types a page may POST cross-origin
// without a CORS preflight (Fetch standard, "CORS-safelisted request-header").
var simpleContentTypes = []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}

// mutating wraps the handler of a mutating endpoint with the checks that
// refuse a request a web page could have sent from another site.
func (g crossSiteGuard) mutating(h http.HandlerFunc, refused *ratelog.Limiter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if msg := g.checkMutation(r); msg != "" {
			refuse(w, r, msg, refused)
			return
		}
		h(w, r)
	}
}

// checkMutation returns why r must be refused, or "".
func (g crossSiteGuard) checkMutation(r *http.Request) string {
	// Sec-Fetch-Site is set by browsers only, and cannot be forged by a
	// page: "none" is a user's own action (typed URL, bookmark).
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Sprintf("Sec-Fetch-Site %q: a web page from another site sent this request; the admin API takes mutating requests only from tools such as curl", site)
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
		return fmt.Sprintf("Origin %q is not this admin API (http://%s): a web page from another site sent this request; send it without an Origin header, as curl does", origin, r.Host)
	}
	ct := r.Header.Get("Content-Type")
	if ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			mt, _, _ = strings.Cut(ct, ";")
			mt = strings.ToLower(strings.TrimSpace(mt))
		}
		if slices.Contains(simpleContentTypes, mt) {
			return fmt.Sprintf("Content-Type %q is what a web page on another site can send without asking; send no body (curl -X POST http://%s%s) or Content-Type: application/json", mt, r.Host, r.URL.Path)
		}
	} else if r.ContentLength != 0 {
		// fetch() sends a Blob without a type with no Content-Type.
		return fmt.Sprintf("a body without Content-Type; send no body (curl -X POST http://%s%s) or Content-Type: application/json", r.Host, r.URL.Path)
	}
	return ""
}

// checkHost returns why r must be refused for the Host it names, or "".
// Only when the admin API listens on loopback: then the only hosts that
// reach it are IP literals and localhost, and any other name is a web
// page that pointed its own name at 127.0.0.1 (DNS rebinding), to which
// Origin and Sec-Fetch-Site look same-origin.
func (g crossSiteGuard) checkHost(r *http.Request) string {
	if !g.loopbackOnly {
		return ""
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ""
	}
	// No Host at all is HTTP/1.0 from a health checker; a browser always
	// sends one.
	if host == "" || strings.EqualFold(host, "localhost") {
		return ""
	}
	if strings.HasSuffix(host, ".") {
		// "localhost." and "127.0.0.1." are absolute names, not the
		// loopback name and address: the resolver does not find them in
		// /etc/hosts and asks DNS, which a hostile network answers (the
		// data path's routes take one trailing dot as the same name; this
		// is an allowlist).
		return fmt.Sprintf("Host %q: the admin API listens on loopback and answers only to an IP address or localhost, without a trailing dot (a name with one is looked up in DNS, which a page rebinding its own name controls); use http://127.0.0.1:PORT, or set [admin] allow_remote = true", r.Host)
	}
	return fmt.Sprintf("Host %q: the admin API listens on loopback and answers only to an IP address or localhost (a name that resolves to 127.0.0.1 may be a web page rebinding its own name); use http://127.0.0.1:PORT, or set [admin] allow_remote = true", r.Host)
}

// sameOrigin reports whether origin (scheme://host[:port]) is the admin
// API itself, reached as host (the request's Host).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "" {
		return false // "null", https:, or not an origin at all
	}
	return strings.EqualFold(withPort(u.Host), withPort(host))
}

// withPort adds HTTP's default port to a host that has none.
func withPort(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), "80")
}

// refuse answers 403 with msg, and logs it, rate-limited.
func refuse(w http.ResponseWriter, r *http.Request, msg string, refused *ratelog.Limiter) {
	refused.Warn("admin: refused a request that may come from a web page", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", msg)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "403 Forbidden: %s\n", msg)
}

func handleIndex(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "hotproxy %s admin API\n\n", version.Version)
	for _, e := range adminEndpoints {
		fmt.Fprintf(w, "  %-24s %s\n", e.pattern, e.help)
	}
	fmt.Fprint(w, "\nPOST with no body (curl -X POST URL) or with Content-Type: application/json;\n"+
		"what a web page on another site could send (a form or text/plain body, an\n"+
		"Origin or Sec-Fetch-Site of another site) is refused with 403.\n")
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	state := s.State()
	switch {
	case state == StateDraining && s.handedOver() && !s.healthFailed.Load():
		// The admin socket is the successor's too, and the successor is
		// LIVE (that is why this one drains): the instance behind this
		// address is ready. This answers only connections accepted in
		// the instant before the hand-over.
		fmt.Fprintln(w, "LIVE (this generation has handed over and drains)")
	case state != StateLive:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, state)
	case s.healthFailed.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "HEALTHCHECK FAILED")
	default:
		fmt.Fprintln(w, state)
	}
}

// ServerInfo is the body of GET /server_info.
type ServerInfo struct {
	Version            string `json:"version"`
	HotRestartVersion  string `json:"hot_restart_version"`
	State              string `json:"state"`
	HealthcheckFailed  bool   `json:"healthcheck_failed"`
	Epoch              int    `json:"epoch"`
	PID                int    `json:"pid"`
	Concurrency        int    `json:"concurrency"`
	UptimeCurrentEpoch string `json:"uptime_current_epoch"`
	UptimeAllEpochs    string `json:"uptime_all_epochs"`
	StartTime          string `json:"start_time"`
	ConfigSource       string `json:"config_source"`
	BaseID             int    `json:"base_id"`
	// Goroutines and OpenFDs show leaks across many restarts.
	Goroutines int `json:"goroutines"`
	OpenFDs    int `json:"open_fds,omitempty"`
	// ReplacedWorkersDraining counts the changes of the dynamic
	// listeners whose removed or replaced listeners still drain (each
	// alone, in place: workers.Manager.UpdateListeners). The name is
	// from when such a change replaced the whole worker set.
	ReplacedWorkersDraining int `json:"replaced_workers_draining"`
}

func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	writeJSON(w, ServerInfo{
		Version:            version.Version,
		HotRestartVersion:  hotrestart.ProtocolVersion,
		State:              s.State().String(),
		HealthcheckFailed:  s.healthFailed.Load(),
		Epoch:              s.opts.Epoch,
		PID:                s.identity.PID,
		Concurrency:        s.concurrency,
		UptimeCurrentEpoch: now.Sub(s.started).Truncate(time.Second).String(),
		UptimeAllEpochs:    now.Sub(s.firstStart).Truncate(time.Second).String(),
		StartTime:          s.started.UTC().Format(time.RFC3339Nano),
		ConfigSource:       s.cfg.Source,
		BaseID:             s.opts.BaseID,
		Goroutines:         runtime.NumGoroutine(),
		OpenFDs:            openFDs(),

		ReplacedWorkersDraining: int(s.dyn.drainingCount.Load()),
	})
}

func (s *Server) handleHealthcheck(fail bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if s.healthFailed.Swap(fail) != fail {
			s.log.Info("admin: healthcheck state changed", "failed", fail)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "OK")
	}
}

func (s *Server) handleQuit(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "OK: draining, then exiting")
	s.requestQuit("admin POST /quitquitquit")
}

// openFDs counts this process's open file descriptors (Linux; 0 where
// /proc is missing).
func openFDs() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(entries) - 1 // the directory being read
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "encoding: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
