package server

import (
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
//	                                 workers.Manager.UpdateListeners, in
//	                                 place: only those listeners; a
//	                                 removed or replaced one drains
//	                                 alone as a hot restart drains, the
//	                                 others keep their sockets and
//	                                 connections as they were
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
	// retired receives the end of the drains that a listener change
	// began; stop ends the goroutines that would send on it once Run has
	// returned.
	retired chan retiredListeners
	stop    chan struct{}
	// draining are the listener changes whose removed or replaced
	// listeners still drain, with the TLS set their connections use,
	// closed once they have drained (nil: none to close).
	draining map[*workers.ListenerUpdate]*tlsconf.Set
	// drainingCount is len(draining), for /server_info.
	drainingCount atomic.Int32
}

// dynamicView is an applied dynamic set and when it was applied.
type dynamicView struct {
	set     DynamicSet
	applied time.Time
}

// retiredListeners is a listener change whose drains have ended.
type retiredListeners struct {
	u *workers.ListenerUpdate
}

func newDynamicState(static *config.Config) dynamicState {
	return dynamicState{
		merged:   static,
		retired:  make(chan retiredListeners),
		stop:     make(chan struct{}),
		draining: map[*workers.ListenerUpdate]*tlsconf.Set{},
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
		if err := s.updateListeners(prep); err != nil {
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
		"listeners_changed", relisten, "versions", fmt.Sprint(d.Versions), "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// listenersChanged reports whether b's listeners differ from a's in
// anything that a listener of workers.Manager fixes when it is built
// (their set, address, protocol, TLS, timeouts of the connection, access
// logs...): all but routes and a tcp listener's cluster, which a snapshot
// carries. Which listeners changed, UpdateListeners tells by the same
// rule (workers' sameFixed).
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

// updateListeners serves prep's listeners with the serving Manager, in
// place (workers.Manager.UpdateListeners): a listener added is bound, a
// removed one drains alone as a hot restart drains (its queue emptied,
// its HTTP connections told to close and closed within drain_time, the
// rest within parent_shutdown_time), a changed one serves new
// connections with its new settings at once, on the same sockets, while
// its old connections finish the same way; every other listener keeps
// its sockets and connections. prep's TLS set serves every new
// handshake from now on (an unchanged listener's too: the same
// certificates, the session-ticket keys handed over); the old set is
// closed once the listeners it served that drain have drained (a
// connection that outlives that keeps the config it handshook with,
// which a closed set leaves as it is). On error nothing changed and prep
// is released.
func (s *Server) updateListeners(prep *Prepared) error {
	// A client's session ticket from before resumes after.
	prep.TLS.InstallTicketKeys(s.tls.TicketKeys())
	u, err := s.workers.UpdateListeners(prep.Snapshot, workers.UpdateOptions{
		ServerTLS:       prep.TLS.ServerConfigs(),
		HTTPTimeout:     s.cfg.Server.DrainTime.D(),
		ShutdownTimeout: s.cfg.Server.ParentShutdownTime.D(),
	})
	if err != nil {
		prep.Close()
		return fmt.Errorf("dynamic listeners: %w", err)
	}
	prep.TLS.Start(tlsconf.StartOptions{Stats: s.stats, Logger: s.log})
	oldTLS := s.tls
	s.setTLS(prep.TLS)
	// The supervisor's copies follow: a listener added or moved is
	// kept there too.
	s.keepSocketsWithSupervisor()
	s.dyn.draining[u] = oldTLS
	s.dyn.drainingCount.Store(int32(len(s.dyn.draining)))
	go func() {
		select {
		case <-u.Done():
		case <-s.dyn.stop:
			return
		}
		select {
		case s.dyn.retired <- retiredListeners{u: u}:
		case <-s.dyn.stop:
		}
	}()
	return nil
}

// setTLS makes set the listeners' TLS (main goroutine).
func (s *Server) setTLS(set *tlsconf.Set) {
	s.tls = set
	s.tlsNow.Store(set)
}

// onDynamicRetired closes the TLS set of a listener change whose drains
// have ended.
func (s *Server) onDynamicRetired(r retiredListeners) {
	if tls := s.dyn.draining[r.u]; tls != nil {
		tls.Close()
	}
	delete(s.dyn.draining, r.u)
	s.dyn.drainingCount.Store(int32(len(s.dyn.draining)))
	if err := r.u.Err(); err != nil {
		s.log.Warn("the listeners a dynamic change removed or replaced: drain ended before every connection finished", "error", err)
	} else {
		s.log.Debug("the listeners a dynamic change removed or replaced have drained",
			"changed", r.u.Changed, "removed", r.u.Removed)
	}
}

// stopRetiredDynamic, at the end of Run: the TLS sets of listener changes
// still draining are closed (the Manager's Close ends their drains).
func (s *Server) stopRetiredDynamic() {
	select {
	case <-s.dyn.stop:
		return
	default:
	}
	close(s.dyn.stop)
	for _, tls := range s.dyn.draining {
		if tls != nil {
			tls.Close()
		}
	}
	clear(s.dyn.draining)
	s.dyn.drainingCount.Store(0)
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
