//go:build !linux

package httpfront

// idlePoller is the Linux idle poller's stub (idlepoll_linux.go): idle
// connections wait in their goroutine.
type idlePoller struct{}

const ParkedSocketsSupported = false

func (p *idlePoller) park(pk *parking) parkResult { return parkFailed }
func (p *idlePoller) unpark(cc *Conn) bool        { return false }
func (p *idlePoller) release(pk *parking)         {}
func (p *idlePoller) joinResumers()               {}
func (p *idlePoller) close()                      {}
