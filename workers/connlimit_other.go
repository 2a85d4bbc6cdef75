//go:build !linux

package workers

import (
	"errors"
	"fmt"
	"net"
)

// openFileLimit: the derived server-wide bound reads RLIMIT_NOFILE on Linux
// only; elsewhere set server.max_connections.
func openFileLimit() (uint64, error) {
	return 0, fmt.Errorf("reading the open-file limit: %w", errors.ErrUnsupported)
}

// acceptAndClose: without a raw non-blocking accept, an accept loop out of
// descriptors backs off instead.
func acceptAndClose(*net.TCPListener) bool { return false }
