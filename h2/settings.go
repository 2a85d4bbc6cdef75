package h2

import "golang.org/x/net/http2"

// peerSettings are the SETTINGS a peer announced (RFC 9113 §6.5.2), with the
// protocol's initial values until its first SETTINGS frame. Side-neutral:
// a client connection tracks its server's settings with the same type.
type peerSettings struct {
	headerTableSize      uint32
	enablePush           bool
	maxConcurrentStreams uint32 // 0 = unlimited (the initial value)
	initialWindowSize    uint32
	maxFrameSize         uint32
	maxHeaderListSize    uint32 // 0 = unlimited
}

func initialPeerSettings() peerSettings {
	return peerSettings{
		headerTableSize:   4096,
		enablePush:        true,
		initialWindowSize: 65535,
		maxFrameSize:      16384,
	}
}

// apply validates one setting and records it. It returns the change of
// SETTINGS_INITIAL_WINDOW_SIZE, which the caller applies to every stream's
// send window, and a ConnectionError for an illegal value.
func (p *peerSettings) apply(s http2.Setting) (windowDelta int64, err error) {
	if err := s.Valid(); err != nil {
		return 0, err // PROTOCOL_ERROR or FLOW_CONTROL_ERROR, per §6.5.2
	}
	switch s.ID {
	case http2.SettingHeaderTableSize:
		p.headerTableSize = s.Val
	case http2.SettingEnablePush:
		p.enablePush = s.Val == 1
	case http2.SettingMaxConcurrentStreams:
		p.maxConcurrentStreams = s.Val
	case http2.SettingInitialWindowSize:
		windowDelta = int64(s.Val) - int64(p.initialWindowSize)
		p.initialWindowSize = s.Val
	case http2.SettingMaxFrameSize:
		p.maxFrameSize = s.Val
	case http2.SettingMaxHeaderListSize:
		p.maxHeaderListSize = s.Val
	}
	// Unknown settings are ignored (§6.5.2).
	return windowDelta, nil
}
