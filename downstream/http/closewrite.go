package httpfront

// writeBeforeClose writes b, the whole of a response after which the
// connection closes, holding its last partial segment back (MSG_MORE,
// Linux) so that the close that follows sends it with the FIN in one
// segment: one segment less per connection-per-request for both ends
// and the loopback path between them, where write then close sent the
// response and the FIN apart (docs/benchmarks.md). Only for a response
// the close follows at once: it is not in the socket until then.
func (cc *Conn) writeBeforeClose(b []byte) error {
	cc.closeLast, cc.rawMore = false, true
	err := cc.write(b)
	cc.rawMore = false
	return err
}
