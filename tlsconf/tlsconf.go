package tlsconf

import (
	"crypto/tls"
	"fmt"
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
	maxVersion := config.TLSVersion(t.MaxVersion)
	if t.MaxVersion == "" {
		maxVersion = tls.VersionTLS13
	}
	if maxVersion == 0 || maxVersion < minVersion {
		return nil, fmt.Errorf("listener %q: tls.max_version %q: use %q or %q, not below min_version", name, t.MaxVersion, config.TLSVersion12, config.TLSVersion13)
	}
	l.tlsConfig = &tls.Config{
		MinVersion:     minVersion,
		MaxVersion:     maxVersion,
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
