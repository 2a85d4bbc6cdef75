//go:build !linux

package steering

import (
	"fmt"
	"sync/atomic"
	"syscall"
)

// Group is not available on this platform.
type Group struct{}

// New always fails here.
func New(Mode) (*Group, error) {
	return nil, fmt.Errorf("eBPF reuseport steering is Linux-only: %w", ErrNotSupported)
}

// Probe always fails here.
func Probe() error { return fmt.Errorf("eBPF reuseport steering is Linux-only: %w", ErrNotSupported) }

func (*Group) Attach([]syscall.Conn) error { return ErrNotSupported }
func (*Group) Active(int) *atomic.Uint64   { return nil }
func (*Group) Migrated() uint64            { return 0 }
func (*Group) Close() error                { return nil }
func Detach(syscall.Conn) error            { return nil }
func MigrateSysctl() (bool, error)         { return false, fmt.Errorf("tcp_migrate_req: %w", ErrNotSupported) }

// Mode: none here.
func (*Group) Mode() Mode { return LeastConn }

// Release: nothing to release here.
func (*Group) Release() error { return nil }

// RefuseNew does nothing here: there is no program.
func (*Group) RefuseNew() {}

// Refused: nothing refused here.
func (*Group) Refused() uint64 { return 0 }

// Shed does nothing here: there is no program.
func (*Group) Shed(bool) {}

// ShedRefused: nothing refused here.
func (*Group) ShedRefused() uint64 { return 0 }
