//go:build !linux

package resmon

import "fmt"

// CgroupMemory is Linux only.
type CgroupMemory struct {
	Version int
	Dir     string
}

// FindCgroupMemory returns ErrNotSupported outside Linux.
func FindCgroupMemory() (*CgroupMemory, error) {
	return nil, fmt.Errorf("cgroup memory: %w", ErrNotSupported)
}

// Read returns ErrNotSupported outside Linux.
func (c *CgroupMemory) Read() (usage, limit uint64, err error) {
	return 0, 0, fmt.Errorf("cgroup memory: %w", ErrNotSupported)
}

// OpenFDs returns ErrNotSupported outside Linux.
func OpenFDs() (int, error) { return 0, fmt.Errorf("open file descriptors: %w", ErrNotSupported) }

// FDLimit returns ErrNotSupported outside Linux.
func FDLimit() (uint64, error) { return 0, fmt.Errorf("RLIMIT_NOFILE: %w", ErrNotSupported) }
