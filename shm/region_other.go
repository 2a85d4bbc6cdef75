//go:build !linux

package shm

import (
	"errors"
	"fmt"
)

var errUnsupported = fmt.Errorf("shm: shared-memory stats region: %w (Linux only)", errors.ErrUnsupported)

// Open is not supported on this platform.
func Open(opts Options) (*Region, error) { return nil, errUnsupported }

// Alloc is not supported on this platform.
func (r *Region) Alloc(name string, kind Kind, mode GaugeMode) (RecordID, error) {
	return 0, errUnsupported
}

// Check is not supported on this platform.
func (r *Region) Check() error { return errUnsupported }

func (r *Region) healLocked() error { return errUnsupported }

// Reap is not supported on this platform.
func (r *Region) Reap() error { return errUnsupported }

// Close is not supported on this platform.
func (r *Region) Close() error { return errUnsupported }

func (r *Region) abandon() {}

// Reader is not supported on this platform.
type Reader struct{}

// OpenReader is not supported on this platform.
func OpenReader(path string) (*Reader, error) { return nil, errUnsupported }

// Snapshot is not supported on this platform.
func (r *Reader) Snapshot() (*Snapshot, error) { return nil, errUnsupported }

// Path is not supported on this platform.
func (r *Reader) Path() string { return "" }

// Close is not supported on this platform.
func (r *Reader) Close() error { return errUnsupported }

func (r *Region) ownerDead(s uint64) bool { return false }
