//go:build !linux

package main

import (
	"errors"
	"fmt"
)

// regionOfConfig needs /proc and the owner locks of the regions: Linux
// only.
func regionOfConfig(cfgPath string) (string, error) {
	return "", fmt.Errorf("%s sets no [stats] path: finding the instance that runs it: %w (Linux only): give --base-id B or --path FILE", cfgPath, errors.ErrUnsupported)
}
