//go:build !unix

package upstream

// peerClosed: without a non-blocking peek, a pooled connection is taken
// as it is; a stale one is caught by the retry of a safe request.
func peerClosed(uintptr) bool { return false }

// readNoWait: without a non-blocking read, a pooled TLS connection is
// taken as it is, as peerClosed does for plaintext.
func readNoWait(uintptr, []byte) (int, error) { return 0, errWouldBlock }
