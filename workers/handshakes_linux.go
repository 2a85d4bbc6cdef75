package workers

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
)

// handshakesPending reports whether any connection to port is still
// between its SYN and its place in a listening socket's queue: a request
// socket (SYN_RECV in /proc/net/tcp, state 03), which a TCP_DEFER_ACCEPT
// socket also keeps until the client's first bytes arrive. A socket that
// closes for good resets those, so a drain keeps it open while there are
// any (acceptor.awaitHandshakes). The files are this network namespace's;
// an unreadable one counts as "none" (the drain then closes as it did).
// A drain-time check only: it reads every TCP socket of the namespace.
func handshakesPending(port int) bool {
	want := []byte(fmt.Sprintf(":%04X", port)) // as the kernel prints it
	for _, name := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 512), 4096)
		sc.Scan() // the header
		for sc.Scan() {
			// "  sl  local_address rem_address   st ..."
			fields := bytes.Fields(sc.Bytes())
			if len(fields) < 4 || !bytes.Equal(fields[3], []byte("03")) {
				continue
			}
			if bytes.HasSuffix(fields[1], want) {
				f.Close()
				return true
			}
		}
		f.Close()
	}
	return false
}
