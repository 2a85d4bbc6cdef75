//go:build !unix

package httpfront

// peekFD: without a non-blocking peek, an idle connection is taken as
// readable and waits in its read, holding a buffer.
func peekFD(uintptr) bool { return true }
