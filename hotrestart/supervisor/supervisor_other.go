//go:build !linux

package supervisor

import (
	"context"
	"fmt"
)

// Supervisor runs generations; it needs Linux.
type Supervisor struct{}

// New returns ErrNotSupported outside Linux.
func New(Options) (*Supervisor, error) {
	return nil, fmt.Errorf("hotproxy supervise: %w", ErrNotSupported)
}

// Run returns ErrNotSupported outside Linux.
func (*Supervisor) Run(context.Context) error { return ErrNotSupported }
