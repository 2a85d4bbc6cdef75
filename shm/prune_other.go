//go:build !linux

package shm

// Prune is implemented for Linux only (OFD locks).
func Prune(path string) (PruneResult, error) { return PruneResult{Path: path}, errUnsupported }

// LiveOwners is implemented for Linux only (OFD locks).
func LiveOwners(path string) ([]Owner, error) { return nil, errUnsupported }
