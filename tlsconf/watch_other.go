//go:build !linux

package tlsconf

import (
	"errors"
	"fmt"
)

// ErrNotSupported: inotify exists on Linux only; elsewhere the files are
// polled.
var ErrNotSupported = errors.New("not supported on this platform")

type watcher struct{ events chan struct{} }

func newWatcher() (*watcher, error) { return nil, fmt.Errorf("inotify: %w", ErrNotSupported) }

func (w *watcher) Add(string) error { return ErrNotSupported }

func (w *watcher) Close() error { return nil }
