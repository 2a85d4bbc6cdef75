package h2

import (
	"time"

	"golang.org/x/net/http2"
)

// The budget of frames that carry no request. A SETTINGS, PING,
// WINDOW_UPDATE, PRIORITY or unknown frame costs the server work and
// asks for nothing; MaxQueuedControlFrames bounds the replies a client
// leaves unread, but a client that reads them (or sends frames that get
// none: PRIORITY, WINDOW_UPDATE, unknown types) could keep a core busy
// for as long as it likes (a SETTINGS flood held one for 8 s with 3–6 M
// frames against x/net's server). Each such frame costs a token; tokens
// come back at ControlFramesPerSecond up to ControlFrameBurst, and
// ControlFramesPerFrameSent for each HEADERS or DATA frame the server
// sends, since a client that answers data with WINDOW_UPDATEs or PINGs
// (gRPC's BDP estimation) sends them in step with the work the connection
// does. nginx closes a SETTINGS flood after ~45 k frames; this budget
// after ~1 k.
const (
	ControlFrameBurst         = 1000
	ControlFramesPerSecond    = 100
	ControlFramesPerFrameSent = 2
)

// costsControl reports whether f is a frame that carries no request: one
// charged to the control budget. ACKs are answers to ours.
func costsControl(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		return !f.IsAck()
	case *http2.PingFrame:
		return !f.IsAck()
	case *http2.WindowUpdateFrame, *http2.PriorityFrame, *http2.UnknownFrame:
		return true
	}
	return false
}

// chargeControlLocked spends a token for f; past the budget the
// connection gets GOAWAY ENHANCE_YOUR_CALM (Events.FloodDetected
// "control-rate").
func (sc *ServerConn) chargeControlLocked(f http2.Frame) error {
	if !costsControl(f) || sc.controls.take(time.Now()) {
		return nil
	}
	sc.floodLocked("control-rate")
	return connErr(http2.ErrCodeEnhanceYourCalm, "too many frames that carry no request")
}

// creditControlLocked earns the client ControlFramesPerFrameSent tokens
// for a HEADERS or DATA frame sent.
func (sc *ServerConn) creditControlLocked() {
	b := &sc.controls
	b.tokens = min(b.burst, b.tokens+ControlFramesPerFrameSent)
}
