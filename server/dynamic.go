package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/tlsconf"
	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers"
)

// Dynamic configuration (issue 23, DESIGN §3c): listeners and clusters
// that a control plane sends (the xDS client maps its resources onto
// config's types) are applied in process, on the main goroutine, as a new
// immutable snapshot built by the same path as the file's:
//
//	DynamicSet ──mergeDynamic──▶ static + dynamic config.Config
//	           ──prepareFrom───▶ Validate, snapshot (unchanged clusters
//	                             carried over), TLS: hotproxy validate's build
//	           ──────────────────▶ routes, clusters, endpoints only:
//	                                 Publish to the serving workers (RCU)
//	                               listeners added, removed or changed:
//	                                 a new workers.Manager on the same
//	                                 sockets; the old one drains as a
//	                                 hot restart drains
//
// A set that fails any step is refused with the error that names what is
// wrong, and nothing of it is left behind: the previous configuration
// serves on.

// DynamicSet is the dynamic half of the configuration: every listener and
// cluster the control plane has sent that was accepted, complete (routes,
// endpoints and TLS resolved), with what config_dump shows of them. Keys
// of Versions, Updated and Raw are resource types (config.XDSListeners...,
// or the type URLs the client uses: they are shown as given).
type DynamicSet struct {
	Listeners []config.Listener
	Clusters  []config.Cluster
	// Versions and Updated are each type's last accepted version and
	// when it was accepted.
	Versions map[string]string
	Updated  map[string]time.Time
	// Raw holds each accepted resource serialized as the control plane
	// sent it (an Any), by type and name: for the hand-over to the next
	// generation. config_dump shows only their names, sizes and digests
	// (a secret's bytes are its private key).
	Raw map[string]map[string][]byte
}

// DynamicUpdate is one dynamic configuration offered to the main
// goroutine (Options.DynamicUpdates).
type DynamicUpdate struct {
	Set DynamicSet
	// Done, when set, is called once with the outcome, on the main
	// goroutine: it must not block. nil: the set serves; an error: it
	// was refused and the previous configuration serves on (the xDS
	// client NACKs with the error's text).
	Done func(error)
}

func (u *DynamicUpdate) done(err error) {
	if u.Done != nil {
		u.Done(err)
	}
}

// dynamicState is the dynamic configuration of the generation. Only the
// main goroutine touches it, but view, which the admin API reads.
type dynamicState struct {
	// merged is the configuration serving now: the file's, plus the
	// dynamic set last applied.
	merged *config.Config
	// view is the dynamic set serving now, for GET /config_dump; nil:
	// none was ever applied.
	view atomic.Pointer[dynamicView]
	// retired receives the end of the drain of a Manager that a listener
	// change replaced; stop ends the goroutines that would send on it
	// once Run has returned.
	retired chan retiredWorkers
	stop    chan struct{}
	// draining are the replaced Managers still draining, with the TLS
	// set each one's connections use (closed after them).
	draining map[*workers.Manager]*tlsconf.Set
	// drainingCount is len(draining), for /server_info.
	drainingCount atomic.Int32
}

// dynamicView is an applied dynamic set and when it was applied.
type dynamicView struct {
	set     DynamicSet
	applied time.Time
}

// retiredWorkers is a replaced Manager whose drain has ended.
type retiredWorkers struct {
	m   *workers.Manager
	err error
}

func newDynamicState(static *config.Config) dynamicState {
	return dynamicState{
		merged:   static,
		retired:  make(chan retiredWorkers),
		stop:     make(chan struct{}),
		draining: map[*workers.Manager]*tlsconf.Set{},
	}
}

// mergeDynamic returns the file's configuration with d's listeners and
// clusters added, d's defaults filled in as config.Load fills in the
// file's. A dynamic resource with the name of a static one is an error
// naming both: which of the two a route means would otherwise depend on
// the order of a list. The result is not validated yet (prepareFrom does
// that, as for the file).
func (s *Server) mergeDynamic(d *DynamicSet) (*config.Config, error) {
	static := s.cfg
	// Defaults go into copies: the set stays as the caller gave it.
	dyn := &config.Config{Listeners: slices.Clone(d.Listeners), Clusters: slices.Clone(d.Clusters)}
	for i := range dyn.Listeners {
		dyn.Listeners[i].Routes = slices.Clone(dyn.Listeners[i].Routes)
	}
	dyn.SetDefaults()

	var clashes []string
	for _, l := range dyn.Listeners {
		if i := slices.IndexFunc(static.Listeners, func(sl config.Listener) bool { return sl.Name == l.Name }); i >= 0 {
			clashes = append(clashes, fmt.Sprintf("dynamic listener %q: the name of static listeners[%d] (%q) of %s; a name is either the file's or the control plane's: rename one of them",
				l.Name, i, l.Name, static.Source))
		}
	}
	for _, c := range dyn.Clusters {
		if i := slices.IndexFunc(static.Clusters, func(sc config.Cluster) bool { return sc.Name == c.Name }); i >= 0 {
			clashes = append(clashes, fmt.Sprintf("dynamic cluster %q: the name of static clusters[%d] (%q) of %s; a name is either the file's or the control plane's: rename one of them",
				c.Name, i, c.Name, static.Source))
		}
	}
	if len(clashes) > 0 {
		return nil, errors.New(strings.Join(clashes, "\n"))
	}
	merged := *static
	merged.Listeners = append(slices.Clone(static.Listeners), dyn.Listeners...)
	merged.Clusters = append(slices.Clone(static.Clusters), dyn.Clusters...)
	// Every message of the validation names its source first.
	merged.Source = static.Source + " with the dynamic configuration"
	return &merged, nil
}

// viewOf is what config_dump shows of d, applied as merged: its listeners
// and clusters with their defaults filled in (merged's own, which nothing
// changes), and copies of its maps, so that the caller's set may change
// under the admin API without harm.
func (s *Server) viewOf(merged *config.Config, d *DynamicSet) *dynamicView {
	return &dynamicView{
		set: DynamicSet{
			Listeners: merged.Listeners[len(s.cfg.Listeners):],
			Clusters:  merged.Clusters[len(s.cfg.Clusters):],
			Versions:  maps.Clone(d.Versions),
			Updated:   maps.Clone(d.Updated),
			Raw:       maps.Clone(d.Raw),
		},
		applied: time.Now(),
	}
}

// applyDynamic makes d the dynamic configuration, on the main goroutine;
// see the top of this file. On error nothing changed.
func (s *Server) applyDynamic(d DynamicSet) error {
	if s.State() != StateLive || !s.hr.state.serving() {
		return fmt.Errorf("dynamic configuration not applied: this generation is %s (hand-over: %s); the next one takes it", s.State(), s.hr.state)
	}
	start := time.Now()
	merged, err := s.mergeDynamic(&d)
	if err != nil {
		return err
	}
	prev := s.snapshot.Load()
	prep, err := prepareFrom(merged, s.identity, s.concurrency, prev)
	if err != nil {
		return err
	}
	relisten := listenersChanged(s.dyn.merged, merged)
	if relisten {
		if err := s.replaceWorkers(prep); err != nil {
			return err
		}
	} else {
		// The listeners' TLS is the one serving: the new set was built
		// only to check it.
		prep.TLS.Close()
		s.workers.Publish(prep.Snapshot)
	}
	s.snapshot.Store(prep.Snapshot)
	s.followClusters(prev, prep.Snapshot)
	s.dyn.merged = merged
	s.dyn.view.Store(s.viewOf(merged, &d))
	s.log.Info("dynamic configuration applied", "listeners", len(d.Listeners), "clusters", len(d.Clusters),
		"listeners_rebuilt", relisten, "versions", fmt.Sprint(d.Versions), "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// listenersChanged reports whether b's listeners differ from a's in
// anything that a workers.Manager fixes when it is built (their set,
// address, protocol, TLS, timeouts of the connection, access logs...):
// all but routes and a tcp listener's cluster, which a snapshot carries.
func listenersChanged(a, b *config.Config) bool {
	if len(a.Listeners) != len(b.Listeners) {
		return true
	}
	fixed := func(l config.Listener) config.Listener {
		l.Routes, l.Cluster = nil, ""
		return l
	}
	before := make(map[string]config.Listener, len(a.Listeners))
	for _, l := range a.Listeners {
		before[l.Name] = fixed(l)
	}
	for _, l := range b.Listeners {
		o, ok := before[l.Name]
		if !ok || !reflect.DeepEqual(o, fixed(l)) {
			return true
		}
	}
	return false
}

// replaceWorkers serves prep's listeners with a new Manager, the way a
// next generation takes over, but within this process: it adopts the
// serving Manager's sockets (a listener that kept its address keeps its
// socket and the connections queued in it; only a new address is bound),
// starts, and then the old Manager drains as a hot restart drains: it
// stops accepting, empties the queues of the sockets no one took (a
// removed listener), tells its HTTP connections to close after their
// response (GOAWAY for HTTP/2), and its connections finish within
// drain_time (TCP: parent_shutdown_time). On error the old Manager serves
// on and prep is released.
func (s *Server) replaceWorkers(prep *Prepared) error {
	old := s.workers
	// Sockets (not SocketDups): a steered listener's program lets go of
	// its sockets so that the new Manager's takes them.
	inherited, err := old.Sockets()
	if err != nil {
		prep.Close()
		return fmt.Errorf("dynamic listeners: %w", err)
	}
	// What the new Manager takes of them it accepts on: the old one's
	// drain leaves what is on its way in those to it.
	handedOver := make(map[workers.SocketKey]bool, len(inherited))
	for k := range inherited {
		handedOver[k] = true
	}
	// A client's session ticket from before resumes after.
	prep.TLS.InstallTicketKeys(s.tls.TicketKeys())
	m, err := workers.New(workers.Options{
		Concurrency: s.concurrency,
		Logger:      s.log,
		Inherited:   inherited, // New owns them now, on success and failure
		Stats:       s.stats,
		ServerTLS:   prep.TLS.ServerConfigs(),

		HeartbeatInterval: s.wd.interval(),
	}, prep.Snapshot)
	if err != nil {
		prep.Close()
		return err
	}
	// Sockets of removed listeners (and of old addresses): the old
	// Manager's drain empties their queues and its close is their last.
	for k, f := range m.Unused() {
		delete(handedOver, k)
		f.Close()
	}
	prep.TLS.Start(tlsconf.StartOptions{Stats: s.stats, Logger: s.log})
	m.Start()
	oldTLS := s.tls
	s.workers = m
	s.setTLS(prep.TLS)
	s.wd.manager.Store(m)
	s.overload.follow(m)
	s.keepSocketsWithSupervisor()
	s.retireWorkers(old, oldTLS, handedOver)
	return nil
}

// setTLS makes set the listeners' TLS (main goroutine).
func (s *Server) setTLS(set *tlsconf.Set) {
	s.tls = set
	s.tlsNow.Store(set)
}

// retireWorkers drains m, replaced by a listener change, on a goroutine
// of its own; the main loop closes it (and tls, its connections' TLS)
// once the drain has ended (onDynamicRetired). handedOver are the
// sockets the new Manager accepts on (workers.DrainOptions).
func (s *Server) retireWorkers(m *workers.Manager, tls *tlsconf.Set, handedOver map[workers.SocketKey]bool) {
	s.dyn.draining[m] = tls
	s.dyn.drainingCount.Store(int32(len(s.dyn.draining)))
	// SIGUSR1 reaches its access logs, and a generation that stops
	// closes it (closeRetired).
	s.hr.retired = append(s.hr.retired, m)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Server.ParentShutdownTime.D())
	drainTime := s.cfg.Server.DrainTime.D()
	go func() {
		defer cancel()
		err := m.Drain(ctx, workers.DrainOptions{HTTPTimeout: drainTime, HandedOver: handedOver})
		select {
		case s.dyn.retired <- retiredWorkers{m: m, err: err}:
		case <-s.dyn.stop:
		}
	}()
}

// onDynamicRetired closes a replaced Manager whose drain has ended.
func (s *Server) onDynamicRetired(r retiredWorkers) {
	r.m.Close()
	if tls := s.dyn.draining[r.m]; tls != nil {
		tls.Close()
	}
	delete(s.dyn.draining, r.m)
	s.dyn.drainingCount.Store(int32(len(s.dyn.draining)))
	s.hr.retired = slices.DeleteFunc(s.hr.retired, func(m *workers.Manager) bool { return m == r.m })
	if r.err != nil {
		s.log.Warn("the workers a listener change replaced: drain ended before every connection finished", "error", r.err)
	} else {
		s.log.Debug("the workers a listener change replaced have drained")
	}
}

// stopRetiredDynamic, at the end of Run: the replaced Managers still
// draining are closed (closeRetired has them) and so are their TLS sets.
func (s *Server) stopRetiredDynamic() {
	select {
	case <-s.dyn.stop:
		return
	default:
	}
	close(s.dyn.stop)
	for m, tls := range s.dyn.draining {
		m.Close()
		tls.Close()
	}
	clear(s.dyn.draining)
}

// followClusters keeps the health monitors in step with the clusters of
// next: a cluster carried over from prev keeps its monitor (and what it
// learned), a removed or rebuilt one's stops, a new one's starts. A new
// cluster's endpoints are routed to from the start, as the monitor finds
// them; its first round of checks starts at once, on the monitor's
// goroutine, never holding up the main one.
func (s *Server) followClusters(prev, next *workers.Snapshot) {
	var keep []*upstream.Monitor
	var names []string
	for i, m := range s.health.list {
		if next.SharesCluster(prev, s.health.names[i]) {
			keep, names = append(keep, m), append(names, s.health.names[i])
			continue
		}
		m.Stop()
	}
	for _, c := range next.Clusters() {
		if next.SharesCluster(prev, c.Name) {
			continue
		}
		if m := upstream.NewMonitor(c, s.log); m != nil {
			m.StartChecking(s.stats)
			keep, names = append(keep, m), append(names, c.Name)
		}
	}
	s.health.list, s.health.names = keep, names
}
