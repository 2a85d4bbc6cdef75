package httpfront

// What the worker, its overload manager and its tests read of a
// connection from another goroutine: atomics, or counters settled once
// the connection has ended.

// Idle reports whether the connection is idle between requests (or,
// HTTP/2, has no stream): what a drain closes.
func (cc *Conn) Idle() bool { return cc.idleSince.Load() != 0 }

// DeadlineMoves says how often the connection moved its socket's read
// and write deadlines (setReadDeadline, setWriteDeadline); settled once
// the connection has ended.
func (cc *Conn) DeadlineMoves() (read, write int) {
	return cc.readDeadlineMoves, cc.writeDeadlineMoves
}

// SpuriousWakes says how many of the connection's idle waits woke with
// nothing to read (readAfterWake); settled once the connection has
// ended.
func (cc *Conn) SpuriousWakes() int { return cc.spuriousWakes }

// Held is how many bytes of buffers the worker's connections hold now.
func (h *BufHolding) Held() int64 { return h.held.Load() }

// Parked reports whether the connection is parked in its worker's idle
// poller now (no goroutine runs it).
func (cc *Conn) Parked() bool {
	pk := cc.parking.Load()
	return pk != nil && pk.state.Load() == stateParked
}
