package workers

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hotproxy/hotproxy/internal/accesslog"
)

// openAccessLogs opens listener l's access logs (each with its writer
// goroutine). Every generation opens the same files: see accesslog's
// package comment for why their lines neither mix nor go missing.
//
// Lines lost to a failed write (a full disk) count in the listener's
// access_log.dropped like the lines a full queue drops: the log's writer
// adds them on lane 0 (the main goroutine's; lane words are atomic, and
// no worker writes lane 0).
func (m *Manager) openAccessLogs(ml *mlistener, specs []accessLogSpec, epoch int) error {
	lost := m.stats.Counter("listener." + ml.name + "." + statAccessLogDropped).Lane(0)
	for _, spec := range specs {
		al, err := accesslog.New(accesslog.Options{
			Path:      spec.path,
			Format:    spec.format,
			QueueSize: spec.queueSize,
			Listener:  ml.name,
			Epoch:     epoch,
			Logger:    m.log.Named("accesslog"),
			LinesLost: lost.Add,
		})
		if err != nil {
			return fmt.Errorf("listener %q: %w", ml.name, err)
		}
		ml.accessLogs = append(ml.accessLogs, al)
	}
	return nil
}

// ReopenAccessLogs asks every access log to open its file again, after
// logrotate moved it (SIGUSR1), without waiting: a writer stuck on a slow
// disk must not hold up the main goroutine. Lines queued before go to the
// old file. A log that cannot be reopened keeps writing to its old file,
// and its writer logs why.
func (m *Manager) ReopenAccessLogs() {
	for _, ml := range m.allListeners() {
		for _, al := range ml.accessLogs {
			al.Reopen()
		}
	}
}

// checkAccessLog is the fail-fast check of an access log, when the
// snapshot is built (and by hotproxy validate), before any socket is
// touched: its directory must exist. The file itself is opened by New,
// which creates it.
func checkAccessLog(path string) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("path %q: directory: %w (create it first)", path, err)
	case !fi.IsDir():
		return fmt.Errorf("path %q: %q is not a directory", path, dir)
	}
	return nil
}
