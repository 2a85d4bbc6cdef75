package exchange

import "github.com/hotproxy/hotproxy/upstream"

// PumpErrorOr returns the error an exchange whose upstream read failed
// with err ends with: the request body pump's (*pump: its result; nil:
// none runs), when it has failed already, since the client's fault
// caused the upstream's, or err. A result it takes is taken for good:
// *pump becomes nil.
func PumpErrorOr(pump *chan error, err error) error {
	if *pump == nil {
		return err
	}
	select {
	case perr := <-*pump:
		*pump = nil
		if perr != nil {
			return perr
		}
	default:
	}
	return err
}

// AbandonHTTP1 gives up a try over an HTTP/1.1 upstream connection whose
// response is not to be read further (a retry follows): the connection
// is closed, not pooled, and the read buffer emptied.
func AbandonHTTP1(up **upstream.Conn, rb *ReadBuffer) {
	if *up != nil {
		(*up).Discard()
		*up = nil
	}
	rb.R, rb.W = 0, 0
}
