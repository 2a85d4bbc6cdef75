package supervisor

import (
	"context"
	"crypto/sha256"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
)

// MinWatchConfig bounds Options.WatchConfig from below: each check reads
// the whole file.
const MinWatchConfig = 100 * time.Millisecond

// configWatcher asks for a reload when the config file's content has
// changed. It compares content, not modification times or inotify events,
// because a Kubernetes ConfigMap volume changes by swapping a symlink
// (..data) that a watch on the file itself never sees, and an editor may
// write the same bytes again. A change is acted on once it has held still
// for one interval (a file written in several steps is read whole), and
// once per content: a config that fails to load is not retried until it
// changes again.
type configWatcher struct {
	path     string
	interval time.Duration
	log      hclog.Logger
	// acted is the content the last reload was asked for (or that was
	// there at start).
	acted [sha256.Size]byte
}

// fileDigest reads path whole; ok is false when it cannot be read (gone
// for a moment during a swap, say), which is no change.
func fileDigest(path string) (sum [sha256.Size]byte, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return sum, false
	}
	return sha256.Sum256(b), true
}

// run polls until ctx ends, calling reload for each settled change.
func (w *configWatcher) run(ctx context.Context, reload func()) {
	w.acted, _ = fileDigest(w.path)
	pending, havePending := [sha256.Size]byte{}, false
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sum, ok := fileDigest(w.path)
		switch {
		case !ok || sum == w.acted:
			havePending = false
		case !havePending || sum != pending:
			// Changed: wait one interval for it to settle.
			pending, havePending = sum, true
		default:
			w.acted, havePending = sum, false
			w.log.Info("the config file changed: reloading", "config", w.path)
			reload()
		}
	}
}
