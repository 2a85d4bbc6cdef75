package httpfront

import (
	"time"

	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
)

// Settings are an HTTP listener's connection settings, compiled with
// the snapshot (the worker's listenerSnap.h1) and fixed when the Manager
// is built (the socket outlives snapshots; routes do not).
type Settings struct {
	Limits        http1.Limits
	HeaderTimeout time.Duration
	IdleTimeout   time.Duration
	WriteTimeout  time.Duration // 0: none
	TrustXFF      bool
	ParkIdle      bool      // park_idle_connections, where the platform can (idlepoll_linux.go)
	ShrunkFrom    *Settings // the listener's own, when these are shrunk (ShrunkSettings)
}

// H2Params are an http listener's HTTP/2 server settings.
type H2Params struct {
	MaxHeaderBytes int
	IdleTimeout    time.Duration
	WriteTimeout   time.Duration
}

// Limits the engine is given beyond what the listener configures. The
// reset budget is the one the x/net-era guard had: a client may cancel
// every stream it has open at once (a browser leaving a page), twice over;
// past it resets are Rapid Reset (CVE-2023-44487).
const (
	h2MaxConcurrentStreams = 250
	h2ResetBurst           = 500
	h2ResetPerSecond       = 50
)

// H2ServerConfig is the engine's configuration for an http listener.
func H2ServerConfig(p H2Params) h2.ServerConfig {
	cfg := h2.ServerConfig{
		MaxConcurrentStreams: h2MaxConcurrentStreams,
		ResetBurst:           h2ResetBurst,
		ResetPerSecond:       h2ResetPerSecond,
		// idle_timeout closes a connection without a stream (GOAWAY
		// NO_ERROR), as an idle HTTP/1.1 one closes.
		IdleTimeout: p.IdleTimeout,
		// write_timeout: a stream whose window the client keeps closed
		// is reset, a socket write blocked that long ends the
		// connection, as an HTTP/1.1 write times out.
		WriteStallTimeout: p.WriteTimeout,
	}
	if p.MaxHeaderBytes > 0 {
		// SETTINGS_MAX_HEADER_LIST_SIZE, the bound on a request's
		// decoded header list (beyond: 431), with HTTP/2's overhead of
		// 32 bytes per field for up to 10 fields (as x/net's server
		// counted it); the encoded block may be twice that before the
		// connection is cut (CONTINUATION flood), so that a list a
		// little over the bound gets its 431.
		cfg.MaxHeaderListSize = uint32(p.MaxHeaderBytes) + 320
		cfg.MaxHeaderBlockBytes = 2 * int(cfg.MaxHeaderListSize)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = -1
	}
	if cfg.WriteStallTimeout <= 0 {
		cfg.WriteStallTimeout = -1
	}
	return cfg
}
