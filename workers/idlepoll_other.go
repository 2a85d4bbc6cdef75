//go:build !linux

package workers

// idlePoller is the Linux idle poller's stub (idlepoll_linux.go): idle
// connections wait in their goroutine.
type idlePoller struct{}

const parkedSocketsSupported = false

func (p *idlePoller) park(cc *clientConn) parkResult { return parkFailed }
func (p *idlePoller) unpark(cc *clientConn) bool     { return false }
func (p *idlePoller) release(cc *clientConn)         {}
func (p *idlePoller) joinResumers()                  {}
func (p *idlePoller) close()                         {}
