//go:build !unix

package workers

// rawIO: without unix read(2) and write(2) on the socket, the client's
// reads and writes go through net.Conn, deadlines armed before each.
const rawIO = false

func writeFD(uintptr, []byte) (int, error) { panic("workers: writeFD without rawIO") }
func readFD(uintptr, []byte) (int, error)  { panic("workers: readFD without rawIO") }
func wouldBlock(error) bool                { return false }
