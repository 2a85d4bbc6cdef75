//go:build !linux

package hotrestart

import (
	"net"
	"os"
)

// NewLinkPair needs Linux.
func NewLinkPair() (*net.UnixConn, *os.File, error) { return nil, nil, ErrNotSupported }
