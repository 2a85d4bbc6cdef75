package tlsconf

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// watcher tells, through events, that something changed in one of the
// directories it watches (inotify). Which file does not matter: the run
// loop reads every certificate file again and compares.
type watcher struct {
	f      *os.File
	events chan struct{}
}

// watchMask is every way a file in a directory can come to hold other
// bytes: written and closed, renamed over, created, deleted, its symlink
// replaced (Kubernetes renames a new "..data" symlink over the old one);
// and the directory itself going away.
const watchMask = unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

func newWatcher() (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	// A non-blocking descriptor in an os.File is read through the
	// runtime's poller, so Close wakes a Read blocked on it.
	w := &watcher{f: os.NewFile(uintptr(fd), "inotify"), events: make(chan struct{}, 1)}
	go w.read()
	return w, nil
}

// Add watches dir. Adding a directory already watched is harmless.
func (w *watcher) Add(dir string) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var addErr error
	err = rc.Control(func(fd uintptr) {
		_, addErr = unix.InotifyAddWatch(int(fd), dir, watchMask|unix.IN_ONLYDIR)
	})
	return errors.Join(err, addErr)
}

func (w *watcher) read() {
	buf := make([]byte, 64<<10)
	for {
		if _, err := w.f.Read(buf); err != nil {
			return // closed
		}
		select {
		case w.events <- struct{}{}:
		default: // one pending event says it all
		}
	}
}

func (w *watcher) Close() error { return w.f.Close() }
