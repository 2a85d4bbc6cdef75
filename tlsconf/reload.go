package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"slices"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// ReloadResult is the outcome of reading one certificate/key pair again.
type ReloadResult struct {
	Listener    string `json:"listener"`
	Certificate int    `json:"certificate"` // index in the listener's certificates list
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	// Error says why the pair was refused (the old one keeps serving);
	// empty when it was loaded and now serves.
	Error string `json:"error,omitempty"`
	// NotAfter is when the serving certificate expires.
	NotAfter time.Time `json:"not_after"`
}

type reloadRequest struct {
	reply chan []ReloadResult
}

// ErrClosed is returned by Reload on a Set that was closed.
var ErrClosed = errors.New("tlsconf: closed")

// Reload reads every certificate/key pair again, changed or not (SIGUSR2,
// POST /tls/reload), swaps in those that load and refuses the others,
// which keep their old pair serving.
func (s *Set) Reload(ctx context.Context) ([]ReloadResult, error) {
	req := reloadRequest{reply: make(chan []ReloadResult, 1)}
	select {
	case s.reloads <- req:
	case <-s.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run owns the files' state, the watch and the rotations, until Close.
func (s *Set) run() {
	defer close(s.done)
	if len(s.listeners) == 0 {
		// Nothing to watch or rotate; answer reloads until Close.
		for {
			select {
			case <-s.stop:
				return
			case req := <-s.reloads:
				req.reply <- nil
			case f := <-s.calls:
				f()
			}
		}
	}
	w, err := newWatcher()
	if err == nil && pollOnly {
		w.Close()
		w, err = nil, errors.New("polling forced")
	}
	if err != nil {
		s.log.Info("certificate files are polled, not watched", "interval", pollInterval, "reason", err)
	} else {
		defer w.Close()
		s.log.Debug("watching certificate files with inotify")
	}
	var poll <-chan time.Time
	if w == nil {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		poll = t.C
	}
	var watchEvents <-chan struct{}
	if w != nil {
		watchEvents = w.events
		s.watchDirs(w)
	}
	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	s.refreshExpiry()

	rotate := time.NewTimer(0)
	defer rotate.Stop()
	s.rotateDue(time.Now(), rotate)

	var settle *time.Timer
	var settleC <-chan time.Time
	var firstChange time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-watchEvents:
			now := time.Now()
			if settle == nil {
				firstChange = now
				settle = time.NewTimer(settleDelay)
			} else {
				settle.Reset(min(settleDelay, max(0, settleMax-now.Sub(firstChange))))
			}
			settleC = settle.C
		case <-settleC:
			settle, settleC = nil, nil
			s.checkFiles(false)
			s.watchDirs(w) // a swapped directory or symlink: watch the new one
		case <-poll:
			s.checkFiles(false)
		case <-sweep.C:
			s.checkFiles(false)
			s.refreshExpiry()
		case <-rotate.C:
			s.rotateDue(time.Now(), rotate)
		case req := <-s.reloads:
			req.reply <- s.checkFiles(true)
			s.watchDirs(w)
		case f := <-s.calls:
			f()
		}
	}
}

// rotateDue rotates the keys of every listener whose rotation is due and
// sets timer to the next one.
func (s *Set) rotateDue(now time.Time, timer *time.Timer) {
	next := time.Time{}
	for _, l := range s.listeners {
		if due := l.nextRotation(); !due.After(now) {
			s.rotate(l, now)
		}
		if due := l.nextRotation(); next.IsZero() || due.Before(next) {
			next = due
		}
	}
	if next.IsZero() {
		timer.Stop() // no listener has TLS
		return
	}
	timer.Reset(max(0, time.Until(next)))
}

// rotate rotates one listener's session-ticket keys, counts and logs it
// (never the keys).
func (s *Set) rotate(l *listener, now time.Time) {
	changed, err := l.rotateTicketKeys(now)
	switch {
	case err != nil:
		s.log.Error("session-ticket keys not rotated", "listener", l.name, "error", err)
	case changed:
		if st := l.stats.Load(); st != nil {
			st.rotation.Inc()
		}
		s.log.Debug("session-ticket keys rotated", "listener", l.name, "next_in", l.rotation)
	}
}

// checkFiles reads every pair's files and loads those that changed since
// last examined (all of them when force), swapping the loaded ones in. It
// runs on the run goroutine.
func (s *Set) checkFiles(force bool) []ReloadResult {
	var results []ReloadResult
	for _, l := range s.listeners {
		cur := l.certs.Load()
		var next []*tls.Certificate
		for i := range l.pairs {
			ps := &l.pairs[i]
			certPEM, keyPEM, err := readPair(ps.files)
			readErr := ""
			if err != nil {
				readErr = err.Error()
			}
			if !force && readErr == ps.readErr && bytes.Equal(certPEM, ps.certPEM) && bytes.Equal(keyPEM, ps.keyPEM) {
				continue
			}
			ps.certPEM, ps.keyPEM, ps.readErr = certPEM, keyPEM, readErr
			r := ReloadResult{Listener: l.name, Certificate: i, Cert: ps.files.Cert, Key: ps.files.Key}
			c, err := config.LoadCertificatePair(ps.files)
			if err != nil {
				r.Error = err.Error()
				r.NotAfter = cur.pairs[i].Leaf.NotAfter
				if st := l.stats.Load(); st != nil {
					st.reloadFailed.Inc()
				}
				s.log.Error("certificate not reloaded: the previous one keeps serving", "listener", l.name,
					"certificate", i, "cert", ps.files.Cert, "key", ps.files.Key, "error", err)
				results = append(results, r)
				continue
			}
			if next == nil {
				next = slices.Clone(cur.pairs)
			}
			next[i] = c
			r.NotAfter = c.Leaf.NotAfter
			if st := l.stats.Load(); st != nil {
				st.reload.Inc()
			}
			s.log.Info("certificate reloaded", "listener", l.name, "certificate", i, "cert", ps.files.Cert,
				"names", c.Leaf.DNSNames, "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
			results = append(results, r)
		}
		if next != nil {
			l.certs.Store(newCertSet(next))
			l.refreshExpiry(time.Now())
		}
	}
	return results
}

// readPair reads a pair's two files as they are now.
func readPair(p config.CertificatePair) (certPEM, keyPEM []byte, err error) {
	certPEM, err = os.ReadFile(p.Cert)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = os.ReadFile(p.Key)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

func (s *Set) refreshExpiry() {
	now := time.Now()
	for _, l := range s.listeners {
		l.refreshExpiry(now)
	}
}

// refreshExpiry sets the listener's expiry gauges from the serving set.
func (l *listener) refreshExpiry(now time.Time) {
	st := l.stats.Load()
	if st == nil {
		return
	}
	for i, c := range l.certs.Load().pairs {
		st.expires[i].Set(int64(c.Leaf.NotAfter.Sub(now) / time.Second))
	}
}

// watchDirs makes w watch the directories the certificate files are
// reached through (see watchedDirs). A directory that cannot be watched
// is left to the minute's sweep.
func (s *Set) watchDirs(w *watcher) {
	if w == nil {
		return
	}
	for _, dir := range s.watchedDirs() {
		if err := w.Add(dir); err != nil {
			s.log.Warn("cannot watch a certificate directory: changes there are seen within a minute", "dir", dir, "error", err)
		}
	}
}

// watchedDirs lists the directory of every certificate and key file,
// and of every symlink on the way to it: a certificate manager that
// renames a new file over the old one changes the file's directory; one
// that points a symlink elsewhere (certbot's live/, Kubernetes' ..data)
// changes the symlink's.
func (s *Set) watchedDirs() []string {
	seen := map[string]bool{}
	var dirs []string
	for _, l := range s.listeners {
		for _, p := range l.pairs {
			for _, f := range []string{p.files.Cert, p.files.Key} {
				for _, d := range symlinkDirs(f) {
					if !seen[d] {
						seen[d] = true
						dirs = append(dirs, d)
					}
				}
			}
		}
	}
	return dirs
}
