//go:build !linux

package safefile

import (
	"fmt"
	"os"
)

// OpenAppend needs Linux.
func OpenAppend(path string, perm os.FileMode) (*os.File, error) {
	return nil, fmt.Errorf("%s: %w", path, ErrNotSupported)
}

// Open needs Linux.
func Open(path string, flags int, perm os.FileMode) (*os.File, error) {
	return nil, fmt.Errorf("%s: %w", path, ErrNotSupported)
}

// MakePrivateDir needs Linux.
func MakePrivateDir(dir string) error { return fmt.Errorf("%s: %w", dir, ErrNotSupported) }

// CheckPrivateDir needs Linux.
func CheckPrivateDir(dir string) error { return fmt.Errorf("%s: %w", dir, ErrNotSupported) }

// CheckDir needs Linux.
func CheckDir(dir string) (int, error) { return -1, fmt.Errorf("%s: %w", dir, ErrNotSupported) }
