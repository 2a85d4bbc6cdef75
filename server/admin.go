package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
)

// adminEndpoints lists the admin API; the index page shows it. Method
// patterns make the mux answer 405 (with Allow) for a wrong method.
var adminEndpoints = []struct{ pattern, help string }{
	{"GET /ready", "200 while this generation serves, 503 otherwise"},
	{"GET /server_info", "version, state, epoch, pid, uptimes (JSON)"},
	{"GET /config_dump", "the effective configuration (JSON)"},
	{"GET /stats", "every stat of this base-id, all generations: name: value (?filter=REGEX, ?usedonly, ?format=json)"},
	{"GET /stats/prometheus", "the same in the Prometheus text format (?filter=REGEX, ?usedonly)"},
	{"POST /healthcheck/fail", "make /ready answer 503 (take this instance out of rotation)"},
	{"POST /healthcheck/ok", "undo /healthcheck/fail"},
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
		"POST /healthcheck/fail": s.handleHealthcheck(true),
		"POST /healthcheck/ok":   s.handleHealthcheck(false),
		"POST /quitquitquit":     s.handleQuit,
	}
	for _, e := range adminEndpoints {
		mux.HandleFunc(e.pattern, handlers[e.pattern])
	}
	mux.HandleFunc("GET /{$}", handleIndex)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.State() != StateLive {
			// This generation is on its way out: the client's next
			// request goes to whoever accepts then.
			w.Header().Set("Connection", "close")
		}
		mux.ServeHTTP(w, r)
	})
}

func handleIndex(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "hotproxy %s admin API\n\n", version.Version)
	for _, e := range adminEndpoints {
		fmt.Fprintf(w, "  %-24s %s\n", e.pattern, e.help)
	}
}

func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	state := s.State()
	switch {
	case state == StateDraining && s.handedOver.Load() && !s.healthFailed.Load():
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
	})
}

func (s *Server) handleConfigDump(w http.ResponseWriter, _ *http.Request) {
	effective := *s.cfg
	effective.Server.Concurrency = s.concurrency
	writeJSON(w, effective)
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
