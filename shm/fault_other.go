//go:build !linux

package shm

import "os"

// explainFault has nothing to explain where regions are not supported.
func explainFault(err error, _ *os.File, _ int) error { return err }

func isFull(error) bool { return false }
