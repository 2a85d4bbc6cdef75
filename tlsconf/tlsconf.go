package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// Stat names, under listener.<name>. (README lists them).
const (
	// StatNoCertificate counts ClientHellos whose SNI named no
	// certificate of the listener (the default one was served). A
	// ClientHello without SNI is not counted: it named nothing.
	StatNoCertificate = "ssl.no_certificate"
	// StatCertificateReload counts certificate/key pairs loaded again and
	// swapped in; StatCertificateReloadFailed those refused (the old
	// pair keeps serving).
	StatCertificateReload       = "ssl.certificate_reload"
	StatCertificateReloadFailed = "ssl.certificate_reload_failed"
	// StatTicketKeyRotation counts session-ticket key rotations.
	StatTicketKeyRotation = "ssl.session_ticket_key_rotation"
)

// expiresGaugeName is the gauge of the seconds left before the listener's
// i-th certificate (in its certificates list) expires.
func expiresGaugeName(listener string, i int) string {
	return "listener." + listener + ".ssl.certificate." + strconv.Itoa(i) + ".expires_in_seconds"
}

// Timings of the watch. Variables, so that tests can shorten them.
var (
	// pollInterval: where inotify is unavailable, the files are read
	// this often (a change is served within a second).
	pollInterval = 500 * time.Millisecond
	// settleDelay: after a change in a watched directory, the files are
	// read once the directory has been quiet this long (a writer that
	// truncates and then writes, or writes the cert and then the key,
	// is seen done), but at most settleMax after the first change.
	settleDelay = 100 * time.Millisecond
	settleMax   = 500 * time.Millisecond
	// sweepInterval: the expiry gauges are refreshed, and the files
	// read (whatever the watch saw), this often.
	sweepInterval = time.Minute
	// pollOnly makes run poll even where inotify works (tests of the
	// fallback).
	pollOnly = false
)

// Set is the TLS of every listener with [listeners.tls] of one
// generation.
type Set struct {
	listeners []*listener
	byName    map[string]*listener
	log       hclog.Logger // set by Start; a null logger before

	// requests reach the goroutine that owns the files' state (run).
	reloads chan reloadRequest
	calls   chan func() // tests: run a function on that goroutine
	stop    chan struct{}
	done    chan struct{}

	startOnce, closeOnce sync.Once
}

// listener is one listener's TLS.
type listener struct {
	name string
	// tlsConfig is handed to the workers and never replaced.
	tlsConfig *tls.Config
	certs     atomic.Pointer[certSet]
	stats     atomic.Pointer[listenerStats] // nil until Start

	// pairs are owned by the run goroutine (and Build, before it).
	pairs []pairState

	rotation time.Duration
	keysFile string
	keysMu   sync.Mutex  // guards keys and next
	keys     []TicketKey // newest first; keys[0] encrypts
	// next is the key the next rotation makes the encrypting one (see
	// TicketKeyRing); it decrypts already. Unused with a keys file.
	next TicketKey
}

// pairState is one certificate/key pair of a listener as last read.
type pairState struct {
	files config.CertificatePair
	// certPEM and keyPEM are what the files held when last examined,
	// loaded or refused, so that an unchanged broken file is not
	// refused (and counted) again at every look.
	certPEM, keyPEM []byte
	readErr         string
}

type listenerStats struct {
	noCertificate, reload, reloadFailed, rotation stats.CounterLane
	expires                                       []stats.GaugeLane
}

// Build loads and checks the TLS of every listener of cfg that has
// [listeners.tls]: every certificate/key pair, the versions, cipher
// suites and ALPN, and the session-ticket keys (generated, or read from
// the keys file). It starts nothing. An error names the listener and the
// file.
func Build(cfg *config.Config) (*Set, error) {
	s := &Set{
		byName:  map[string]*listener{},
		log:     hclog.NewNullLogger(),
		reloads: make(chan reloadRequest),
		calls:   make(chan func()),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	now := time.Now()
	for i := range cfg.Listeners {
		lc := &cfg.Listeners[i]
		if lc.TLS == nil {
			continue
		}
		l, err := buildListener(lc.Name, lc.TLS, now)
		if err != nil {
			return nil, err
		}
		s.listeners = append(s.listeners, l)
		s.byName[l.name] = l
	}
	return s, nil
}

func buildListener(name string, t *config.ListenerTLS, now time.Time) (*listener, error) {
	if len(t.Certificates) == 0 {
		return nil, fmt.Errorf("listener %q: tls.certificates: none given (TLS needs at least one certificate/key pair)", name)
	}
	l := &listener{name: name, rotation: t.SessionTicketRotation.D(), keysFile: t.SessionTicketKeysFile}
	if l.rotation <= 0 {
		l.rotation = config.DefaultSessionTicketRotation
	}
	minVersion := config.TLSVersion(t.MinVersion)
	if minVersion == 0 {
		return nil, fmt.Errorf("listener %q: tls.min_version %q: use %q or %q", name, t.MinVersion, config.TLSVersion12, config.TLSVersion13)
	}
	var suites []uint16
	for j, cs := range t.CipherSuites {
		id, ok := config.CipherSuiteID(cs)
		if !ok {
			return nil, fmt.Errorf("listener %q: tls.cipher_suites[%d] %q: not a secure TLS 1.2 cipher suite", name, j, cs)
		}
		suites = append(suites, id)
	}
	l.tlsConfig = &tls.Config{
		MinVersion:     minVersion,
		CipherSuites:   suites,
		NextProtos:     slices.Clone(t.ALPN),
		GetCertificate: l.getCertificate,
	}
	loaded := make([]*tls.Certificate, len(t.Certificates))
	l.pairs = make([]pairState, len(t.Certificates))
	for j, p := range t.Certificates {
		ps := pairState{files: p}
		ps.certPEM, ps.keyPEM, _ = readPair(p)
		c, err := config.LoadCertificatePair(p)
		if err != nil {
			return nil, fmt.Errorf("listener %q: tls.certificates[%d]: %w", name, j, err)
		}
		loaded[j] = c
		l.pairs[j] = ps
	}
	l.certs.Store(newCertSet(loaded))

	var keys []TicketKey
	var err error
	if l.keysFile != "" {
		if keys, err = readTicketKeysFile(l.keysFile, now); err != nil {
			return nil, fmt.Errorf("listener %q: tls.session_ticket_keys_file: %w", name, err)
		}
	} else {
		k, err := newTicketKey(now)
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", name, err)
		}
		keys = []TicketKey{k}
		if l.next, err = newTicketKey(now); err != nil {
			return nil, fmt.Errorf("listener %q: %w", name, err)
		}
	}
	l.installKeysLocked(keys) // nobody else can see l yet
	return l, nil
}

// getCertificate is the listener's tls.Config.GetCertificate. It runs on
// the connection's goroutine, on any worker: it loads the current set and
// picks from it, without a lock.
func (l *listener) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, named := l.certs.Load().choose(hello.ServerName)
	if !named && hello.ServerName != "" {
		if st := l.stats.Load(); st != nil {
			// Lane 0 from many goroutines: an atomic add, correct from
			// any of them, and rare enough not to contend.
			st.noCertificate.Inc()
		}
	}
	return cert, nil
}

// ServerConfigs returns each listener's server config, by listener name
// (workers.Options.ServerTLS). Each stays the same pointer for the
// generation's life, and must be used as it is, never cloned: a clone
// would not see rotated session-ticket keys.
func (s *Set) ServerConfigs() map[string]*tls.Config {
	m := make(map[string]*tls.Config, len(s.listeners))
	for _, l := range s.listeners {
		m[l.name] = l.tlsConfig
	}
	return m
}

// StartOptions configure Start. The zero value of each field is the
// default.
type StartOptions struct {
	// Stats receives the listeners' ssl.* stats; nil: none are counted.
	Stats *stats.Store
	// Logger defaults to a null logger.
	Logger hclog.Logger
}

// Start attaches the stats and starts watching the certificate files and
// rotating the session-ticket keys. Call it once, after InstallTicketKeys
// if the keys came from a previous generation.
func (s *Set) Start(opts StartOptions) {
	s.startOnce.Do(func() {
		if opts.Logger != nil {
			s.log = opts.Logger.Named("tls")
		}
		if st := opts.Stats; st != nil {
			for _, l := range s.listeners {
				ls := &listenerStats{
					noCertificate: st.Counter("listener." + l.name + "." + StatNoCertificate).Lane(0),
					reload:        st.Counter("listener." + l.name + "." + StatCertificateReload).Lane(0),
					reloadFailed:  st.Counter("listener." + l.name + "." + StatCertificateReloadFailed).Lane(0),
					rotation:      st.Counter("listener." + l.name + "." + StatTicketKeyRotation).Lane(0),
				}
				for i := range l.pairs {
					ls.expires = append(ls.expires, st.Gauge(expiresGaugeName(l.name, i), stats.GaugeNewest).Lane(0))
				}
				l.stats.Store(ls)
			}
		}
		go s.run()
	})
}

// Close stops the watch and the rotations. The configs keep serving what
// they hold.
func (s *Set) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	s.startOnce.Do(func() { close(s.done) }) // never started: nothing to wait for
	<-s.done
	return nil
}

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
