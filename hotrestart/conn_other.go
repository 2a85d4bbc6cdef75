//go:build !linux

package hotrestart

import (
	"fmt"
	"net"
	"os"
	"time"
)

type conn struct {
	uc      *net.UnixConn
	timeout time.Duration
}

func (c *conn) send(*Message, []*os.File) error { return ErrNotSupported }

func (c *conn) recv(time.Duration) (*Message, []*os.File, error) { return nil, nil, ErrNotSupported }

func (c *conn) closeGracefully() { c.uc.Close() }

func parentPID(int) (int, error) { return 0, ErrNotSupported }

func listen(addr string) (*net.UnixListener, error) {
	return nil, fmt.Errorf("restart socket %s: %w", addr, ErrNotSupported)
}

func dial(addr string, _ time.Duration) (*net.UnixConn, error) {
	return nil, fmt.Errorf("restart socket %s: %w", addr, ErrNotSupported)
}
