package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/tlsconf"
)

// TLS: the listeners' server configs are built with the snapshot (a
// certificate that does not load stops New, naming the file), take the
// previous generation's session-ticket keys in the takeover, and are
// handed to the workers (workers.Options.ServerTLS) on start and on a
// rollback alike. Certificates are re-read when their files change (the
// Set watches them), on SIGUSR2 and on POST /tls/reload.

// reloadTimeout bounds a certificate reload asked for by SIGUSR2 or the
// admin API: reading a few files.
const reloadTimeout = 10 * time.Second

// tlsReloadSignals returns the channel SIGUSR2 arrives on, and the function
// that stops it. Registered from New on, like SIGUSR1: SIGUSR2's default
// action would kill a generation still starting. Without
// Options.HandleSignals the channel never receives.
func (s *Server) tlsReloadSignals() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	if !s.opts.HandleSignals {
		return ch, func() {}
	}
	signal.Notify(ch, syscall.SIGUSR2)
	return ch, func() { signal.Stop(ch) }
}

// takeTicketKeys asks the previous generation for its session-ticket keys
// and installs them, before this generation serves: a client's ticket
// from there resumes here. A previous generation too old to hand them
// over leaves this one with keys of its own (one full handshake per
// client), said once.
func (s *Server) takeTicketKeys(ch *hotrestart.Child) error {
	wire, offered, err := ch.SessionTicketKeys()
	if err != nil {
		return fmt.Errorf("receiving the TLS session-ticket keys: %w", err)
	}
	if !offered {
		if len(s.tls.ServerConfigs()) > 0 {
			s.log.Info("the previous generation cannot hand over TLS session-ticket keys (hot-restart protocol before 1.3): "+
				"this one made its own, so clients resuming a TLS session do one full handshake",
				"from_version", ch.Parent().BinaryVersion)
		}
		return nil
	}
	fromWire := func(k hotrestart.TicketKey) tlsconf.TicketKey {
		return tlsconf.TicketKey{Key: [hotrestart.TicketKeySize]byte(k.Key), Created: time.Unix(0, k.Created)}
	}
	keys := make(map[string]tlsconf.TicketKeyRing, len(wire))
	for _, l := range wire {
		var ring tlsconf.TicketKeyRing
		for _, k := range l.Keys {
			ring.Keys = append(ring.Keys, fromWire(k))
		}
		if l.Next != nil {
			ring.Next = fromWire(*l.Next)
		}
		keys[l.Listener] = ring
	}
	installed := s.tls.InstallTicketKeys(keys)
	s.log.Debug("took over TLS session-ticket keys", "listeners", installed)
	return nil
}

// SessionTicketKeys hands this generation's session-ticket keys to the
// next (hotrestart.TicketKeySource). tlsconf.Set is safe to read from the
// session's goroutine.
func (h successorHandler) SessionTicketKeys() []hotrestart.ListenerTicketKeys {
	var out []hotrestart.ListenerTicketKeys
	toWire := func(k tlsconf.TicketKey) hotrestart.TicketKey {
		return hotrestart.TicketKey{Key: k.Key[:], Created: k.Created.UnixNano()}
	}
	for name, ring := range h.tls.Load().TicketKeys() {
		next := toWire(ring.Next)
		l := hotrestart.ListenerTicketKeys{Listener: name, Next: &next}
		for _, k := range ring.Keys {
			l.Keys = append(l.Keys, toWire(k))
		}
		out = append(out, l)
	}
	return out
}

// reloadCertificates re-reads every certificate/key pair (SIGUSR2). It
// runs on a goroutine of its own: the main loop never waits on files.
func (s *Server) reloadCertificates(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	results, err := s.tlsNow.Load().Reload(ctx)
	if err != nil {
		s.log.Error(why+": certificates not reloaded", "error", err)
		return
	}
	refused := 0
	for _, r := range results {
		if r.Error != "" {
			refused++ // the Set has logged it, naming the file
		}
	}
	s.log.Info(why+": certificates reloaded", "pairs", len(results)-refused, "refused", refused)
}

// handleTLSReload is POST /tls/reload: every pair read again; 200 when
// all serve, 422 when some were refused (they keep their old pair
// serving), with one entry per pair.
func (s *Server) handleTLSReload(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), reloadTimeout)
	defer cancel()
	results, err := s.tlsNow.Load().Reload(ctx)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
		}
		http.Error(w, "certificates not reloaded: "+err.Error(), status)
		return
	}
	if results == nil {
		results = []tlsconf.ReloadResult{}
	}
	status := http.StatusOK
	for _, res := range results {
		if res.Error != "" {
			status = http.StatusUnprocessableEntity
		}
	}
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		http.Error(w, "encoding: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
