//go:build !linux

package hotrestart

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
)

type conn struct {
	uc      *net.UnixConn
	timeout time.Duration
}

func (c *conn) send(*Message, []*os.File) error { return ErrNotSupported }

func (c *conn) recv(time.Duration) (*Message, []*os.File, error) { return nil, nil, ErrNotSupported }

func (c *conn) closeGracefully() { c.uc.Close() }

func parentPID(int) (int, error) { return 0, ErrNotSupported }

// ProcessStartTime needs Linux.
func ProcessStartTime(int) (uint64, error) { return 0, ErrNotSupported }

func listen(addrs []string, _ hclog.Logger) (*net.UnixListener, string, error) {
	return nil, "", fmt.Errorf("restart socket %s: %w", addrs[0], ErrNotSupported)
}

func dial(addr string, _ time.Duration) (*net.UnixConn, error) {
	return nil, fmt.Errorf("restart socket %s: %w", addr, ErrNotSupported)
}
