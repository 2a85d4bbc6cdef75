package supervisor

import (
	"bufio"
	"fmt"
	"net"
	"os"
)

// ParseRequestForTest exposes parseRequest to the external tests.
func ParseRequestForTest(b []byte) (Request, error) { return parseRequest(b) }

// FakeControlEnv: a test binary re-executed with it set to a path (as
// another user) is a fake supervisor listening there (MaybeRunFakeControl).
const FakeControlEnv = "SUPERVISOR_TEST_FAKE_CONTROL"

// MaybeRunFakeControl, from TestMain: with FakeControlEnv set, listen at
// its path, say "listening" on stdout, answer every request with a
// made-up status, and never return.
func MaybeRunFakeControl() {
	path := os.Getenv(FakeControlEnv)
	if path == "" {
		return
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		bufio.NewReader(c).ReadString('\n') // the request, so that it is not reset
		c.Write([]byte(`{"ok":true,"status":{"pid":1,"serving_epoch":42}}` + "\n"))
		c.Close()
	}
}
