//go:build unix && !linux

package rawsock

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"
)

// Listener accepts Conns from a listening TCP socket: Linux only
// (accept4(2), and the listening socket's TCP_NODELAY passed on to the
// sockets it accepts).
type Listener struct{}

// Acceptor is one goroutine's accept on a Listener.
type Acceptor struct{}

// Listen reports that raw accepts are for Linux.
func Listen(*net.TCPListener) (*Listener, error) {
	return nil, fmt.Errorf("raw accepted sockets on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func (l *Listener) SetDeadline(time.Time) error { return errors.ErrUnsupported }
func (l *Listener) Close() error                { return nil }
func (l *Listener) NewAcceptor() *Acceptor      { return &Acceptor{} }
func (a *Acceptor) Accept() (*Conn, error)      { return nil, errors.ErrUnsupported }
func (a *Acceptor) AcceptQueued() *Conn         { return nil }
