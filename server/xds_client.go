package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/xds"
)

// The xDS client of a generation (issue 23): with an [xds] table, New
// builds an xds.Client that dials the control plane's static cluster as
// the proxy dials its upstreams (its endpoints in turn, its client TLS),
// and runs it for the generation's life. Its Updates reach the main loop,
// which applies each one (applyDynamic) and calls Done: the client ACKs
// or NACKs. The main goroutine stays the only owner of the configuration;
// the client owns only its stream.
//
// At start, a generation that took its predecessor's resources over
// (hotrestart.FeatureXDSResources) serves them from the first byte and
// resumes the stream with their versions; one that did not (epoch 0, or an
// older predecessor) serves its static listeners at once but holds its
// readiness (/ready, the supervisor's readiness, the predecessor's drain)
// until the first warm set is applied or initial_fetch_timeout has passed,
// as Envoy holds its initialization: see awaitFirstXDS.

// xdsLink is the generation's xDS client.
type xdsLink struct {
	client *xds.Client
	cancel context.CancelFunc
	// ended is closed when the client's Run has returned (its private
	// secret directory removed).
	ended chan struct{}
	// accepted is the last state the main goroutine applied: what the
	// next generation is handed (read by the restart socket's sessions).
	accepted atomic.Pointer[xds.State]
	// events reaches the xDS stats once they exist (they are made once
	// the stats region is attached, after a take-over may have started
	// the client); events before that are not counted.
	events atomic.Pointer[xdsStats]
	// handedOver: the client started from the predecessor's resources.
	handedOver bool
}

// xdsStartTimeout bounds the wait, during a take-over, for the client to
// hand back the predecessor's resources mapped (no network is involved).
const xdsStartTimeout = 10 * time.Second

// startXDS builds and starts the xDS client of [xds], from initial (the
// predecessor's resources; nil: none). A no-op without [xds] or once
// started.
func (s *Server) startXDS(initial *xds.State) error {
	x := s.cfg.XDS
	if !x.Enabled() || s.xdsc != nil {
		return nil
	}
	cp := s.XDSControlPlane()
	if cp == nil || len(cp.Endpoints) == 0 {
		return fmt.Errorf("xds.cluster: %q: no such cluster with endpoints in %s (it must be a static cluster of the file)", x.Cluster, s.cfg.Source)
	}
	var types []xds.TypeURL
	for _, r := range x.Resources {
		t, err := xds.ParseType(r)
		if err != nil {
			return fmt.Errorf("xds.resources: %w", err)
		}
		types = append(types, t)
	}
	nodeID, nodeCluster := x.NodeID, x.NodeCluster
	if nodeID == "" {
		nodeID, _ = os.Hostname()
		if nodeID == "" {
			nodeID = "hotproxy"
		}
	}
	if nodeCluster == "" {
		nodeCluster = "hotproxy"
	}
	link := &xdsLink{ended: make(chan struct{}), handedOver: initial != nil}
	if s.xds != nil {
		link.events.Store(s.xds)
	}
	ev := func() XDSEvents {
		if xs := link.events.Load(); xs != nil {
			return xs
		}
		return nopXDSEvents{}
	}
	// The endpoints in turn, one per attempt: a control plane down
	// leaves the next one tried after the back-off.
	var next atomic.Uint64
	dial := func(ctx context.Context) (*grpc.ClientConn, error) {
		i := int(next.Add(1)-1) % len(cp.Endpoints)
		tlsConfig := cp.ClientTLS(i)
		if tlsConfig != nil {
			tlsConfig = tlsConfig.Clone()
		}
		return xds.DialTarget(cp.Endpoints[i].Address, tlsConfig)(ctx)
	}
	c, err := xds.New(xds.Config{
		Dial:                dial,
		NodeID:              nodeID,
		NodeCluster:         nodeCluster,
		Protocol:            xds.Protocol(x.Protocol),
		InitialFetchTimeout: x.InitialFetchTimeout.D(),
		Types:               types,
		Initial:             initial,
		Logger:              s.log,
		Events: xds.Events{
			UpdateAttempt:  func(t xds.TypeURL) { ev().UpdateAttempt(t.Name()) },
			UpdateRejected: func(t xds.TypeURL, err error) { ev().UpdateRejected(t.Name(), err) },
			Connected:      func(up bool) { ev().Connected(up) },
			// Called with every ACK, after UpdateSuccess: the one
			// that knows the version.
			Version: func(t xds.TypeURL, version string, _ uint64) { ev().UpdateSuccess(t.Name(), version) },
		},
	})
	if err != nil {
		return fmt.Errorf("[xds]: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	link.client, link.cancel = c, cancel
	go func() {
		defer close(link.ended)
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("xDS client stopped", "error", err)
		}
	}()
	s.xdsc = link
	s.xdsNow.Store(link)
	s.log.Info("following the xDS control plane", "cluster", x.Cluster, "endpoints", len(cp.Endpoints),
		"protocol", x.Protocol, "node_id", nodeID, "handed_over", initial != nil)
	return nil
}

// stopXDS ends the client and waits (bounded) for it to clean up.
func (s *Server) stopXDS() {
	if s.xdsc == nil {
		return
	}
	s.xdsc.cancel()
	select {
	case <-s.xdsc.ended:
	case <-time.After(5 * time.Second):
		s.log.Warn("the xDS client did not stop within 5s")
	}
}

// xdsUpdates is the client's channel while this generation serves and may
// apply a set; nil otherwise (a generation handing over leaves the set in
// flight unanswered: it is the child's to apply).
func (s *Server) xdsUpdates() <-chan *xds.Update {
	if s.xdsc == nil || !s.hr.state.serving() || s.State() != StateLive {
		return nil
	}
	return s.xdsc.client.Updates()
}

// applyXDS applies an Update of the client, on the main goroutine.
func (s *Server) applyXDS(u *xds.Update) {
	err := s.applyDynamic(dynamicSetOf(u.State))
	if err == nil {
		s.xdsc.accepted.Store(u.State)
	}
	u.Done(err)
}

// dynamicSetOf is st as the server applies it; types are named as config
// names them (listeners, routes...).
func dynamicSetOf(st *xds.State) DynamicSet {
	d := DynamicSet{
		Listeners: st.Listeners,
		Clusters:  st.Clusters,
		Versions:  map[string]string{},
		Updated:   map[string]time.Time{},
		Raw:       map[string]map[string][]byte{},
	}
	for t, v := range st.Versions {
		d.Versions[t.Name()] = v
	}
	for t, at := range st.Updated {
		d.Updated[t.Name()] = at
	}
	for t, byName := range st.Raw {
		d.Raw[t.Name()] = byName
	}
	return d
}

// awaitFirstXDS holds the generation's readiness until the first warm set
// of the control plane is applied, or initial_fetch_timeout has passed
// (then it serves the static part, and says so). A set refused is NACKed
// and the wait goes on. A generation that was handed its predecessor's
// resources, or has no [xds], does not wait; one that took over from a
// predecessor that had none waits at most half of handoff_timeout. It
// returns a reason to stop when ctx ends or a stop signal comes
// meanwhile, else "".
func (s *Server) awaitFirstXDS(ctx context.Context, sigs <-chan os.Signal, beat <-chan time.Time) string {
	if s.xdsc == nil || s.xdsc.handedOver || s.xdsc.accepted.Load() != nil {
		return ""
	}
	timeout := s.cfg.XDS.InitialFetchTimeout.D()
	if s.takeover.predecessor != nil {
		// The predecessor waits for this generation's drain message at
		// most handoff_timeout after the sockets: past it, it would
		// take this one for dead and serve on, never draining.
		timeout = min(timeout, s.cfg.HotRestart.HandoffTimeout.D()/2)
	}
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case u := <-s.xdsc.client.Updates():
			s.applyXDS(u)
			if s.xdsc.accepted.Load() != nil {
				s.log.Info("first xDS configuration applied: ready", "after", time.Since(start).Round(time.Millisecond))
				return ""
			}
		case <-deadline.C:
			s.log.Warn("initial_fetch_timeout: no configuration from the control plane yet; serving the static part of the file and reporting ready. The dynamic configuration is applied when it comes",
				"initial_fetch_timeout", timeout, "cluster", s.cfg.XDS.Cluster)
			return ""
		case <-beat:
			s.wd.beatMain()
		case <-ctx.Done():
			return "context ended"
		case sig := <-sigs:
			return "signal " + sig.String()
		}
	}
}

// XDSResources is what this generation hands its successor: the xDS
// state it last applied (hotrestart.FeatureXDSResources).
func (h successorHandler) XDSResources() *hotrestart.XDSResources {
	if h.xds == nil {
		return nil
	}
	l := h.xds.Load()
	if l == nil {
		return nil
	}
	st := l.accepted.Load()
	if st == nil {
		return nil
	}
	return wireOfXDSState(st)
}

func wireOfXDSState(st *xds.State) *hotrestart.XDSResources {
	w := &hotrestart.XDSResources{Versions: map[string]string{}, Updated: map[string]int64{}}
	for t, v := range st.Versions {
		w.Versions[string(t)] = v
	}
	for t, at := range st.Updated {
		if !at.IsZero() {
			w.Updated[string(t)] = at.UnixNano()
		}
	}
	for t, byName := range st.Raw {
		for name, raw := range byName {
			w.Resources = append(w.Resources, hotrestart.XDSResource{Type: string(t), Name: name,
				Version: st.ResourceVersions[t][name], Any: raw})
		}
	}
	return w
}

// xdsStateOfWire is the predecessor's resources as the client's Initial.
func xdsStateOfWire(w *hotrestart.XDSResources) (*xds.State, error) {
	st := &xds.State{
		Versions:         map[xds.TypeURL]string{},
		ResourceVersions: map[xds.TypeURL]map[string]string{},
		Updated:          map[xds.TypeURL]time.Time{},
		Raw:              map[xds.TypeURL]map[string][]byte{},
	}
	for t, v := range w.Versions {
		st.Versions[xds.TypeURL(t)] = v
	}
	for t, at := range w.Updated {
		st.Updated[xds.TypeURL(t)] = time.Unix(0, at)
	}
	for _, r := range w.Resources {
		t, err := xds.ParseType(r.Type)
		if err != nil {
			return nil, fmt.Errorf("handed-over resource %q: %w", r.Name, err)
		}
		if st.Raw[t] == nil {
			st.Raw[t] = map[string][]byte{}
			st.ResourceVersions[t] = map[string]string{}
		}
		if _, dup := st.Raw[t][r.Name]; dup {
			return nil, fmt.Errorf("handed-over %s %q: sent twice", t.Name(), r.Name)
		}
		st.Raw[t][r.Name] = r.Any
		if r.Version != "" {
			st.ResourceVersions[t][r.Name] = r.Version
		}
	}
	return st, nil
}

// takeXDSResources, during a take-over and before the sockets are taken:
// the predecessor's last accepted xDS resources are mapped by a client
// started from them, validated and built with the file's (the same build
// as New's), so that this generation serves them from its first
// connection, and its stream resumes from their versions. Any error stops
// the take-over: the predecessor serves on, never noticing.
func (s *Server) takeXDSResources(ch *hotrestart.Child) error {
	if !s.cfg.XDS.Enabled() {
		return nil
	}
	w, offered, err := ch.XDSResources()
	if err != nil {
		return fmt.Errorf("receiving the xDS resources: %w", err)
	}
	if !offered {
		s.log.Info("the previous generation cannot hand over its xDS resources (hot-restart protocol before 1.5): "+
			"this one waits for the control plane", "from_version", ch.Parent().BinaryVersion)
		return nil
	}
	if w == nil || len(w.Resources) == 0 {
		return nil
	}
	initial, err := xdsStateOfWire(w)
	if err != nil {
		return err
	}
	if err := s.startXDS(initial); err != nil {
		return err
	}
	var u *xds.Update
	select {
	case u = <-s.xdsc.client.Updates():
	case <-s.xdsc.ended:
		return errors.New("the xDS client could not take the handed-over resources (see the log)")
	case <-time.After(xdsStartTimeout):
		return fmt.Errorf("the xDS client did not map the handed-over resources within %s", xdsStartTimeout)
	}
	set := dynamicSetOf(u.State)
	if err := s.rebuildWithDynamic(&set); err != nil {
		u.Done(err)
		return fmt.Errorf("the handed-over xDS resources (versions %v): %w", w.Versions, err)
	}
	s.xdsc.accepted.Store(u.State)
	u.Done(nil)
	s.log.Info("took over the xDS resources of the previous generation", "resources", len(w.Resources),
		"listeners", len(set.Listeners), "clusters", len(set.Clusters), "versions", fmt.Sprint(dynamicSetOf(u.State).Versions))
	return nil
}

// rebuildWithDynamic builds the file's configuration with d, in New before
// anything is bound, and makes it the generation's.
func (s *Server) rebuildWithDynamic(d *DynamicSet) error {
	merged, err := s.mergeDynamic(d)
	if err != nil {
		return err
	}
	prep, err := Prepare(merged, s.identity)
	if err != nil {
		return err
	}
	s.stopHealthMonitors()
	s.health.list, s.health.names = nil, nil
	s.tls.Close()
	s.snapshot.Store(prep.Snapshot)
	s.setTLS(prep.TLS)
	s.dyn.merged = merged
	s.dyn.view.Store(s.viewOf(merged, d))
	s.startHealthChecks()
	return nil
}
