package h2

// Flow-control window accounting (RFC 9113 §6.9). Side-neutral: a client
// connection uses the same two types as a server connection, sendWindow for
// what the peer lets us send and recvWindow for what we let the peer send.

// maxWindow is the largest legal flow-control window, 2^31-1.
const maxWindow = 1<<31 - 1

// sendWindow is how many DATA bytes the peer still accepts from us on one
// stream or on the connection. It may go negative when the peer lowers
// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.9.2).
type sendWindow struct{ n int64 }

// add credits a WINDOW_UPDATE increment or a SETTINGS delta; it reports
// false when the window would pass 2^31-1, a FLOW_CONTROL_ERROR.
func (w *sendWindow) add(n int64) bool {
	if w.n+n > maxWindow {
		return false
	}
	w.n += n
	return true
}

// available is how much may be sent now, never negative.
func (w *sendWindow) available() int64 {
	if w.n < 0 {
		return 0
	}
	return w.n
}

func (w *sendWindow) take(n int64) { w.n -= n }

// recvWindow is the window we advertised to the peer: avail is what the peer
// may still send, unsent the credit we owe back but batch into one
// WINDOW_UPDATE (sent once it reaches half the window, so the peer never
// stalls on a window we have in fact freed).
type recvWindow struct {
	size   int32 // the window we want the peer to see when all is consumed
	avail  int32
	unsent int32
}

func newRecvWindow(size int32) recvWindow { return recvWindow{size: size, avail: size} }

// receive accounts n bytes arriving in DATA (padding included); it reports
// false when the peer sent more than the window allows.
func (w *recvWindow) receive(n int32) bool {
	if n > w.avail || n < 0 {
		return false
	}
	w.avail -= n
	return true
}

// release gives back n consumed bytes and returns the WINDOW_UPDATE
// increment to send now, 0 while the credit is still being batched.
func (w *recvWindow) release(n int32) int32 {
	w.unsent += n
	if w.unsent < w.size/2 && w.avail > 0 {
		return 0
	}
	inc := w.unsent
	w.unsent = 0
	w.avail += inc
	return inc
}
