//go:build !linux

package safefiletest

import "errors"

func mountTmpfs(string, int) error { return errors.New("tmpfs needs Linux") }

func unmount(string) error { return nil }
