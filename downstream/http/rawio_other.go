//go:build !unix

package httpfront

// RawIO: without unix read(2) and write(2) on the socket, the client's
// reads and writes go through net.Conn, deadlines armed before each.
const RawIO = false

func writeFD(uintptr, []byte) (int, error) { panic("httpfront: writeFD without RawIO") }
func readFD(uintptr, []byte) (int, error)  { panic("httpfront: readFD without RawIO") }
func wouldBlock(error) bool                { return false }
