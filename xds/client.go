package xds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Client is one ADS subscription. Run owns all of its state, on one
// goroutine; the main goroutine sees it only as Updates.
type Client struct {
	cfg     Config
	log     hclog.Logger
	updates chan *Update
	// done carries an Update's outcome back to Run.
	done chan error

	m     mapper
	types map[TypeURL]*typeState

	// Run's state, touched only by its goroutine.
	stream    int // counts streams; a response is ACKed on its own stream only
	upStream  int // the stream Events.Connected(true) was told of
	wire      wire
	inFlight  bool   // an Update waits for Done
	delivered *State // the last State the main goroutine accepted
	dirty     bool   // a fetch timed out: the set may be complete now
	// heldSince is when a set first waited for a cluster its listeners
	// name (unknownClusters).
	heldSince  time.Time
	firstAsked time.Time // when the wildcard types were first requested
}

// typeState is the client's view of one resource type.
type typeState struct {
	url      TypeURL
	wildcard bool // LDS and CDS: every resource of the type
	accepted map[string]*resource
	version  string // the accepted version_info
	updated  time.Time
	nonce    string // the last nonce of this stream
	// pending is a response mapped without error, waiting to be part of
	// a complete set (then an Update); inFlight: it is in the Update the
	// main goroutine holds.
	pending  *response
	inFlight bool
	// queued is a response that came while pending was in flight: it
	// is handled once Done came (a server may send the next response
	// before it has the ACK of the last one).
	queued    *response
	queuedErr error
	// received: a response came (or the initial state, or the initial
	// fetch timed out): the type no longer holds back the first Update.
	received bool
	// asked is when each name of a dependent type was first wanted; a
	// name still missing InitialFetchTimeout later no longer holds back
	// an Update.
	asked map[string]time.Time
	// sent are the names of the last request on this stream.
	sent []string
	// spare are the resources of the last SotW response accepted that
	// nothing referenced then (go-control-plane answers a request with
	// no names with every resource of the type): a listener that names
	// one later finds it here, since the server, holding the version
	// ACKed, would not send it again.
	spare map[string]*resource
	// rejected is the last set of this type refused, with why: the same
	// set sent again (a SotW server answers a NACK by sending the state
	// it has again) is refused again without an Update, after a delay
	// that doubles, so that the two sides do not loop at the speed of a
	// round trip.
	rejected *rejection
}

type rejection struct {
	set   map[string]*resource
	err   error
	count int
	// due is when the deferred NACK of nonce goes out; zero: none waits.
	due   time.Time
	nonce string
	resp  *response // the last response refused, to look at again
}

// Bounds of the delay before a set refused before is refused again.
const (
	renackDelayBase = 250 * time.Millisecond
	renackDelayMax  = 30 * time.Second
)

// New checks cfg and returns a Client; Run starts it.
func New(cfg Config) (*Client, error) {
	if cfg.Dial == nil {
		return nil, errors.New("xds: Config.Dial is nil: say how to reach the control plane")
	}
	if cfg.NodeID == "" {
		return nil, errors.New("xds: node_id is empty: the control plane tells proxies apart by it")
	}
	switch cfg.Protocol {
	case "":
		cfg.Protocol = DefaultProtocol
	case ProtocolDelta, ProtocolSotW:
	default:
		return nil, fmt.Errorf("xds: protocol %q: use %q or %q", cfg.Protocol, ProtocolDelta, ProtocolSotW)
	}
	if cfg.InitialFetchTimeout <= 0 {
		cfg.InitialFetchTimeout = DefaultInitialFetchTimeout
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if len(cfg.Types) == 0 {
		cfg.Types = AllTypes
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	c := &Client{cfg: cfg, log: cfg.Logger.Named("xds"), updates: make(chan *Update), done: make(chan error, 1),
		types: map[TypeURL]*typeState{}}
	for _, t := range cfg.Types {
		if _, err := ParseType(string(t)); err != nil {
			return nil, fmt.Errorf("xds: types: %w", err)
		}
		c.types[t] = &typeState{url: t, wildcard: t == ListenerType || t == ClusterType,
			accepted: map[string]*resource{}, asked: map[string]time.Time{}}
	}
	return c, nil
}

// Updates delivers warm, complete States; the receiver must call Done on
// each. Read it from the goroutine that applies configuration.
func (c *Client) Updates() <-chan *Update { return c.updates }

// Run holds the stream until ctx ends, opening a new one with jittered
// back-off whenever it breaks, and returns ctx's error.
func (c *Client) Run(ctx context.Context) error {
	files, cleanup, err := newSecretFiles(c.cfg.SecretDir)
	if err != nil {
		return err
	}
	defer cleanup()
	c.m.files = files
	if err := c.restore(ctx); err != nil {
		return err
	}
	var (
		recv      chan recvResult
		cancel    context.CancelFunc = func() {}
		reconnect                    = time.NewTimer(0)
		fetch                        = time.NewTimer(time.Hour)
		attempt   int
	)
	defer func() { cancel() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-reconnect.C:
			sctx, stop := context.WithCancel(ctx)
			cancel = stop
			recv, err = c.connect(sctx)
			if err != nil {
				stop()
				c.log.Warn("control plane unreachable", "error", err)
				reconnect.Reset(c.backoff(attempt))
				attempt++
			}
		case r := <-recv:
			if r.err != nil && r.resp == nil {
				c.log.Warn("xDS stream broke", "error", r.err)
				cancel()
				recv = nil
				c.disconnected()
				if r.answered {
					attempt = 0
				}
				reconnect.Reset(c.backoff(attempt))
				attempt++
				continue
			}
			if c.upStream != r.resp.stream {
				// The stream is up once it answered.
				c.upStream = r.resp.stream
				if c.cfg.Events.Connected != nil {
					c.cfg.Events.Connected(true)
				}
			}
			c.handleResponse(r.resp, r.err)
		case err := <-c.done:
			c.handleDone(err)
		case <-fetch.C:
			c.dirty = true
			c.sendDeferredNACKs()
		}
		if err := c.advance(ctx); err != nil {
			return err
		}
		fetch.Reset(c.nextFetchDeadline())
	}
}

type recvResult struct {
	resp *response
	err  error
	// answered: the stream had delivered a response before it broke,
	// so the next attempt starts the back-off from the beginning.
	answered bool
}

// connect opens a stream and sends the first request of every type.
func (c *Client) connect(ctx context.Context) (chan recvResult, error) {
	conn, err := c.cfg.Dial(ctx)
	if err != nil {
		return nil, err
	}
	node := &corev3.Node{Id: c.cfg.NodeID, Cluster: c.cfg.NodeCluster, UserAgentName: "hotproxy"}
	w, err := newWire(ctx, conn, c.cfg.Protocol, node)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.stream++
	c.wire = w
	for _, ts := range c.types {
		ts.nonce, ts.sent = "", nil
		if ts.pending != nil && !ts.inFlight {
			ts.pending = nil // its nonce belonged to the old stream
		}
	}
	if c.firstAsked.IsZero() {
		c.firstAsked = time.Now()
	}
	for _, t := range c.cfg.Types {
		if err := c.sendRequest(c.types[t], nil, true); err != nil {
			conn.Close()
			return nil, err
		}
	}
	ch := make(chan recvResult, 1)
	stream := c.stream
	go func() {
		defer conn.Close()
		answered := false
		for {
			resp, err := w.recv()
			if resp != nil {
				resp.stream = stream
				answered = true
			}
			select {
			case ch <- recvResult{resp: resp, err: err, answered: answered}:
			case <-ctx.Done():
				return
			}
			if resp == nil {
				return
			}
		}
	}()
	return ch, nil
}

func (c *Client) disconnected() {
	c.wire = nil
	if c.upStream == c.stream && c.cfg.Events.Connected != nil {
		c.cfg.Events.Connected(false)
	}
	c.upStream = 0
	for _, ts := range c.types {
		if ts.pending != nil && !ts.inFlight {
			ts.pending = nil
		}
		ts.queued, ts.queuedErr = nil, nil
	}
}

// backoff is full jitter over an exponential ceiling.
func (c *Client) backoff(attempt int) time.Duration {
	ceiling := c.cfg.BackoffMax
	if attempt < 30 {
		if d := c.cfg.BackoffBase << attempt; d < ceiling {
			ceiling = d
		}
	}
	return time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
}

// sendRequest tells the server about ts: the names wanted, and the ACK
// (nack nil) or NACK of ts.nonce. first: the first request of the type on
// this stream (resumption: the versions held).
func (c *Client) sendRequest(ts *typeState, nack error, first bool) error {
	return c.sendRequestFor(ts, c.wanted(ts), nack, first)
}

// sendNACK NACKs ts.nonce with err, asking for the names of the request
// it answers: a NACK does not change the subscription (Envoy's way), and
// go-control-plane in ADS mode never answers, nor remembers, a SotW
// request naming fewer resources than its snapshot has (a set refused
// beside the cluster that named them).
func (c *Client) sendNACK(ts *typeState, err error) error {
	return c.sendRequestFor(ts, ts.sent, err, false)
}

func (c *Client) sendRequestFor(ts *typeState, names []string, nack error, first bool) error {
	if c.wire == nil {
		return nil
	}
	r := request{typeURL: ts.url, version: ts.version, nonce: ts.nonce, wildcard: ts.wildcard, names: names, nack: nack}
	if first {
		r.initial = map[string]string{}
		for n, res := range ts.accepted {
			if res.version != "" {
				r.initial[n] = res.version
			}
		}
	}
	ts.sent = r.names
	c.log.Debug("request", "type", ts.url.Short(), "version", r.version, "nonce", r.nonce, "names", r.names, "nack", r.nack != nil)
	if err := c.wire.send(r); err != nil {
		return fmt.Errorf("xds: sending a %s request: %w", ts.url.Short(), err)
	}
	return nil
}

// wanted are the names a dependent type is asked for: what the listeners
// and clusters, accepted or pending, reference.
func (c *Client) wanted(ts *typeState) []string {
	if ts.wildcard {
		return nil
	}
	set := c.candidate()
	return references(set[ListenerType], set[ClusterType])[ts.url]
}

// candidate is the set of resources the client would hold if every
// pending response were accepted, per type.
func (c *Client) candidate() map[TypeURL]map[string]*resource {
	set := map[TypeURL]map[string]*resource{}
	for t, ts := range c.types {
		set[t] = applyResponse(ts, ts.pending)
		for n, r := range ts.spare {
			if _, ok := set[t][n]; !ok {
				set[t][n] = r
			}
		}
	}
	// A dependent type holds only what is referenced.
	refs := references(set[ListenerType], set[ClusterType])
	for _, t := range []TypeURL{RouteType, EndpointType, SecretType} {
		for n := range set[t] {
			if !slices.Contains(refs[t], n) {
				delete(set[t], n)
			}
		}
	}
	return set
}

// applyResponse returns ts's accepted set with r applied.
func applyResponse(ts *typeState, r *response) map[string]*resource {
	if r == nil {
		return maps.Clone(ts.accepted)
	}
	if ts.wildcard && !r.delta {
		return maps.Clone(r.resources) // SotW LDS and CDS: the whole state
	}
	out := maps.Clone(ts.accepted)
	maps.Copy(out, r.resources)
	for _, n := range r.removed {
		delete(out, n)
	}
	return out
}

func (c *Client) handleResponse(r *response, decodeErr error) {
	ts := c.types[r.typeURL]
	if ts == nil {
		c.log.Warn("response for a type not subscribed", "type", r.typeURL)
		return
	}
	if ts.inFlight {
		if ts.queued != nil && decodeErr == nil && ts.queuedErr == nil {
			r = mergeResponses(ts.queued, r, ts.wildcard)
		}
		ts.queued, ts.queuedErr = r, decodeErr
		return
	}
	if c.cfg.Events.UpdateAttempt != nil {
		c.cfg.Events.UpdateAttempt(r.typeURL)
	}
	c.log.Debug("response", "type", r.typeURL.Short(), "version", r.version, "nonce", r.nonce, "resources", len(r.resources), "removed", len(r.removed))
	ts.nonce = r.nonce
	err := decodeErr
	if err == nil {
		for _, n := range sortedNames(r.resources) {
			// A resource that did not change keeps its mapping: a SotW
			// server resends every resource of a type at each change.
			res := r.resources[n]
			if held := ts.accepted[n]; held != nil && bytes.Equal(held.raw, res.raw) {
				res.mapped = held.mapped
			}
			if err = c.m.mapResource(r.typeURL, res); err != nil {
				break
			}
		}
	}
	if old := ts.pending; old != nil && err == nil {
		r = mergeResponses(old, r, ts.wildcard)
	}
	if err != nil && decodeErr == nil && !r.delta {
		// SotW, refused by the mapping: remembered like a set the main
		// goroutine refused, so that a SotW server sending it again
		// gets its NACK only after the delay.
		if old := ts.pending; old != nil {
			r = mergeResponses(old, r, ts.wildcard)
		}
		if c.deferRefusedAgain(ts, r) {
			return
		}
		set := applyResponse(ts, r)
		c.reject(ts, err)
		ts.rejected = &rejection{set: set, err: err, resp: r}
		return
	}
	if err != nil {
		c.reject(ts, err)
		return
	}
	if c.deferRefusedAgain(ts, r) {
		return
	}
	ts.rejected = nil
	ts.pending = r
	ts.received = true
	for _, dep := range []TypeURL{RouteType, EndpointType, SecretType} {
		if dts := c.types[dep]; dts != nil && !dts.inFlight {
			c.resubscribe(dts)
		}
	}
}

// deferRefusedAgain: r brings the set of ts refused last; its NACK goes
// out again only after a delay that doubles (sendDeferredNACKs).
func (c *Client) deferRefusedAgain(ts *typeState, r *response) bool {
	rj := ts.rejected
	if rj == nil || !sameSet(applyResponse(ts, r), rj.set) {
		return false
	}
	d := renackDelayMax
	if rj.count < 20 {
		d = min(renackDelayBase<<rj.count, renackDelayMax)
	}
	rj.count++
	rj.due, rj.nonce, rj.resp = time.Now().Add(d), r.nonce, r
	ts.pending = nil
	return true
}

// mergeResponses folds a response still waiting (old) into the next one
// of its type. A dependent type's names change while its last response
// waits for the rest of a set (a new cluster needs its endpoints): the
// request that asks for the new names carries the waiting response's
// nonce, which the server takes as its ACK, so the next response may
// hold only what changed (delta) and the waiting one's resources must
// not be lost.
func mergeResponses(old, r *response, wildcard bool) *response {
	if !r.delta && wildcard {
		return r // SotW LDS and CDS: the whole state
	}
	if !r.delta && !old.delta {
		// SotW: the new response holds every name asked for.
		merged := maps.Clone(old.resources)
		maps.Copy(merged, r.resources)
		out := *r
		out.resources = merged
		return &out
	}
	out := *r
	out.resources = maps.Clone(old.resources)
	maps.Copy(out.resources, r.resources)
	for _, n := range r.removed {
		delete(out.resources, n)
	}
	out.removed = nil
	for _, n := range old.removed {
		if _, back := out.resources[n]; !back {
			out.removed = append(out.removed, n)
		}
	}
	out.removed = append(out.removed, r.removed...)
	return &out
}

// resubscribe sends ts's names when they changed; a response of ts that
// waits is ACKed by it (see mergeResponses).
func (c *Client) resubscribe(ts *typeState) {
	want := c.wanted(ts)
	now := time.Now()
	for _, n := range want {
		if _, ok := ts.asked[n]; !ok {
			ts.asked[n] = now
		}
	}
	if !slices.Equal(want, ts.sent) {
		if err := c.sendRequest(ts, nil, false); err != nil {
			c.log.Warn("resubscribing", "error", err)
		}
	}
}

// reject NACKs ts's current nonce with err; the accepted set stays.
func (c *Client) reject(ts *typeState, err error) {
	c.log.Warn("rejected xDS resources", "type", ts.url.Short(), "error", err)
	if c.cfg.Events.UpdateRejected != nil {
		c.cfg.Events.UpdateRejected(ts.url, err)
	}
	if ts.pending != nil {
		ts.rejected = &rejection{set: applyResponse(ts, ts.pending), err: err, resp: ts.pending}
	}
	ts.pending = nil
	ts.inFlight = false
	if serr := c.sendNACK(ts, err); serr != nil {
		c.log.Warn("sending a NACK", "error", serr)
	}
}

// accept makes ts's pending response the accepted set and ACKs it on
// its stream.
func (c *Client) accept(ts *typeState, set map[string]*resource) {
	r := ts.pending
	ts.pending, ts.inFlight = nil, false
	if !sameSet(ts.accepted, set) || ts.updated.IsZero() {
		ts.updated = time.Now()
	}
	changed := !sameSet(ts.accepted, set)
	ts.accepted, ts.version = set, r.version
	if !ts.wildcard && !r.delta {
		ts.spare = map[string]*resource{}
		for n, res := range r.resources {
			if _, ok := set[n]; !ok {
				ts.spare[n] = res
			}
		}
	}
	if changed {
		c.reconsiderRejected(ts)
	}
	if c.cfg.Events.UpdateSuccess != nil {
		c.cfg.Events.UpdateSuccess(ts.url)
	}
	if c.cfg.Events.Version != nil {
		h := fnv.New64a()
		h.Write([]byte(ts.version))
		c.cfg.Events.Version(ts.url, ts.version, h.Sum64())
	}
	if r.stream == c.stream {
		if err := c.sendRequest(ts, nil, false); err != nil {
			c.log.Warn("sending an ACK", "error", err)
		}
	}
}

func sameSet(a, b map[string]*resource) bool {
	return maps.EqualFunc(a, b, func(x, y *resource) bool { return bytes.Equal(x.raw, y.raw) })
}

// advance sends an Update when the candidate set is warm and complete, or
// ACKs at once a set that changes nothing.
func (c *Client) advance(ctx context.Context) error {
	if c.inFlight {
		return nil
	}
	var pending []*typeState
	for _, t := range c.cfg.Types {
		if ts := c.types[t]; ts.pending != nil {
			pending = append(pending, ts)
		}
	}
	if len(pending) == 0 && !c.dirty {
		return nil
	}
	now := time.Now()
	timedOut := func(at time.Time) bool { return !at.IsZero() && now.Sub(at) >= c.cfg.InitialFetchTimeout }
	// Every wildcard type answered (or gave up on), for the first set.
	for _, ts := range c.types {
		if ts.wildcard && !ts.received {
			if !timedOut(c.firstAsked) {
				return nil
			}
			c.log.Warn("initial_fetch_timeout: going on without this type", "type", ts.url.Short(), "timeout", c.cfg.InitialFetchTimeout)
			ts.received = true
		}
	}
	set := c.candidate()
	if c.delivered != nil && !c.dirty {
		unchanged := true
		for _, ts := range pending {
			unchanged = unchanged && sameSet(ts.accepted, set[ts.url])
		}
		if unchanged {
			// Only versions moved (a SotW server resends a type whose
			// resources did not change): ACK, nothing to apply.
			for _, ts := range pending {
				c.accept(ts, set[ts.url])
			}
			return nil
		}
	}
	// Warm: every reference arrived, or its fetch timed out.
	refs := references(set[ListenerType], set[ClusterType])
	for t, names := range refs {
		ts := c.types[t]
		for _, n := range names {
			if ts == nil {
				return c.rejectAll(pending, fmt.Errorf("%s %q is referenced but %s is not subscribed (add it to [xds] types)", t.Short(), n, t.Short()))
			}
			if _, ok := set[t][n]; ok {
				continue
			}
			if !timedOut(ts.asked[n]) {
				return nil
			}
		}
	}
	c.dirty = false
	if len(pending) == 0 && c.delivered != nil {
		return nil
	}
	st, err := resolve(set)
	if err != nil {
		return c.rejectAll(pending, err)
	}
	if missing := c.unknownClusters(st); len(missing) > 0 {
		if c.heldSince.IsZero() {
			c.heldSince = now
		}
		if !timedOut(c.heldSince) {
			c.dirty = true
			return nil
		}
		c.log.Warn("initial_fetch_timeout: listeners name clusters that did not come; handing the set over as it is", "clusters", missing)
	}
	c.heldSince = time.Time{}
	c.fillVersions(st, set)
	if c.delivered != nil && sameRaw(c.delivered.Raw, st.Raw) {
		// A reconnect brought back what is held: nothing to apply.
		for _, ts := range pending {
			c.accept(ts, set[ts.url])
		}
		return nil
	}
	for _, ts := range pending {
		ts.inFlight = true
	}
	c.inFlight = true
	u := &Update{State: st, ack: func(err error) { c.done <- err }}
	select {
	case c.updates <- u:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// unknownClusters are the clusters st's listeners name that st does not
// have and that are not static (see Config.StaticClusters).
func (c *Client) unknownClusters(st *State) []string {
	have := map[string]bool{}
	for _, cl := range st.Clusters {
		have[cl.Name] = true
	}
	for _, n := range c.cfg.StaticClusters {
		have[n] = true
	}
	var missing []string
	check := func(name string) {
		if name == "" || have[name] || slices.Contains(missing, name) {
			return
		}
		// Without the static names, only a dynamic cluster being
		// removed is known not to be static.
		if c.cfg.StaticClusters == nil {
			if ts := c.types[ClusterType]; ts == nil || ts.accepted[name] == nil {
				return
			}
		}
		missing = append(missing, name)
	}
	for _, l := range st.Listeners {
		check(l.Cluster)
		for _, r := range l.SNIRoutes {
			check(r.Cluster)
		}
		for _, r := range l.Routes {
			for _, name := range r.ClusterNames() {
				check(name)
			}
		}
	}
	return missing
}

func (c *Client) rejectAll(pending []*typeState, err error) error {
	if len(pending) == 0 {
		c.log.Warn("the xDS state cannot be handed over", "error", err)
	}
	for _, ts := range pending {
		c.reject(ts, err)
	}
	c.dirty = false
	return nil
}

// handleDone ACKs or NACKs the responses of the Update in flight.
func (c *Client) handleDone(err error) {
	c.inFlight = false
	if err != nil {
		for _, t := range c.cfg.Types {
			if ts := c.types[t]; ts.inFlight {
				c.reject(ts, err)
			}
		}
		c.handleQueued()
		return
	}
	set := c.candidate()
	for _, t := range c.cfg.Types {
		if ts := c.types[t]; ts.inFlight {
			c.accept(ts, set[t])
		}
	}
	c.adoptSpare()
	// Resources a pending response still waiting brought are in set;
	// only the accepted ones count.
	held := map[TypeURL]map[string]*resource{}
	for t, ts := range c.types {
		held[t] = ts.accepted
	}
	st := &State{}
	c.fillVersions(st, held)
	c.delivered = st
	keep := map[string]bool{}
	for _, byName := range set {
		for _, r := range byName {
			for _, f := range filesOf(r) {
				keep[f] = true
			}
		}
	}
	for _, byName := range held {
		for _, r := range byName {
			for _, f := range filesOf(r) {
				keep[f] = true
			}
		}
	}
	for _, ts := range c.types {
		for _, r := range ts.spare {
			for _, f := range filesOf(r) {
				keep[f] = true
			}
		}
	}
	c.m.files.prune(keep)
	c.handleQueued()
	for _, dep := range []TypeURL{RouteType, EndpointType, SecretType} {
		if dts := c.types[dep]; dts != nil {
			c.resubscribe(dts)
		}
	}
}

// adoptSpare makes the spare resources the accepted listeners and
// clusters now name part of their type's accepted set: the main
// goroutine took a State holding them.
func (c *Client) adoptSpare() {
	held := map[TypeURL]map[string]*resource{}
	for t, ts := range c.types {
		held[t] = ts.accepted
	}
	refs := references(held[ListenerType], held[ClusterType])
	for t, names := range refs {
		ts := c.types[t]
		if ts == nil {
			continue
		}
		for _, n := range names {
			if r := ts.spare[n]; r != nil && ts.accepted[n] == nil {
				ts.accepted[n] = r
				delete(ts.spare, n)
			}
		}
	}
}

// handleQueued handles the responses that came while an Update was in
// flight.
func (c *Client) handleQueued() {
	for _, t := range c.cfg.Types {
		ts := c.types[t]
		if r := ts.queued; r != nil {
			err := ts.queuedErr
			ts.queued, ts.queuedErr = nil, nil
			c.handleResponse(r, err)
		}
	}
}

func filesOf(r *resource) []string {
	switch m := r.mapped.(type) {
	case *mappedListener:
		return m.files
	case *mappedCluster:
		return m.files
	case *mappedSecret:
		return m.files
	}
	return nil
}

// fillVersions sets st's versions, times and raw resources from set.
func (c *Client) fillVersions(st *State, set map[TypeURL]map[string]*resource) {
	st.Versions = map[TypeURL]string{}
	st.ResourceVersions = map[TypeURL]map[string]string{}
	st.Updated = map[TypeURL]time.Time{}
	st.Raw = map[TypeURL]map[string][]byte{}
	now := time.Now()
	for t, ts := range c.types {
		st.Versions[t] = ts.version
		st.Updated[t] = ts.updated
		if ts.pending != nil {
			st.Versions[t] = ts.pending.version
			if !sameSet(ts.accepted, set[t]) || ts.updated.IsZero() {
				st.Updated[t] = now
			}
		}
		st.Raw[t] = map[string][]byte{}
		rv := map[string]string{}
		for n, r := range set[t] {
			st.Raw[t][n] = r.raw
			if r.version != "" {
				rv[n] = r.version
			}
		}
		st.ResourceVersions[t] = rv
	}
}

func sameRaw(a, b map[TypeURL]map[string][]byte) bool {
	return maps.EqualFunc(a, b, func(x, y map[string][]byte) bool { return maps.EqualFunc(x, y, bytes.Equal) })
}

// reconsiderRejected forgets the sets of the other types refused before,
// now that changed's accepted set changed: a set refused with the old
// state (a cluster removed while a route still named it) may be good with
// the new one. One whose repeated NACK waits is looked at again now.
func (c *Client) reconsiderRejected(changed *typeState) {
	for _, t := range c.cfg.Types {
		ts := c.types[t]
		rj := ts.rejected
		if ts == changed || rj == nil {
			continue
		}
		ts.rejected = nil
		if !rj.due.IsZero() && rj.nonce == ts.nonce && ts.pending == nil && !ts.inFlight {
			c.handleResponse(rj.resp, nil)
		}
	}
}

// sendDeferredNACKs refuses again, once due, a set refused before.
func (c *Client) sendDeferredNACKs() {
	for _, ts := range c.types {
		rj := ts.rejected
		if rj == nil || rj.due.IsZero() || time.Now().Before(rj.due) {
			continue
		}
		rj.due = time.Time{}
		if ts.nonce != rj.nonce || ts.pending != nil {
			continue // a newer response came meanwhile
		}
		if c.cfg.Events.UpdateRejected != nil {
			c.cfg.Events.UpdateRejected(ts.url, rj.err)
		}
		if err := c.sendNACK(ts, rj.err); err != nil {
			c.log.Warn("sending a NACK", "error", err)
		}
	}
}

// nextFetchDeadline is how long until a fetch that is waited for times out.
func (c *Client) nextFetchDeadline() time.Duration {
	next := time.Hour
	now := time.Now()
	// A deadline already past was acted on by advance; only those to
	// come matter.
	consider := func(at time.Time) {
		if at.IsZero() {
			return
		}
		if d := at.Add(c.cfg.InitialFetchTimeout).Sub(now); d > 0 && d < next {
			next = d
		}
	}
	consider(c.heldSince)
	for _, ts := range c.types {
		if rj := ts.rejected; rj != nil && !rj.due.IsZero() {
			if d := time.Until(rj.due); d < next {
				next = max(d, time.Millisecond)
			}
		}
		if ts.wildcard && !ts.received {
			consider(c.firstAsked)
		}
		for _, at := range ts.asked {
			consider(at)
		}
	}
	return next
}

// restore takes the hand-over: Initial's resources become the accepted
// sets, delivered as the first Update before any stream.
func (c *Client) restore(ctx context.Context) error {
	in := c.cfg.Initial
	if in == nil {
		return nil
	}
	for t, byName := range in.Raw {
		ts := c.types[t]
		if ts == nil {
			continue
		}
		for name, raw := range byName {
			var a anypb.Any
			if err := proto.Unmarshal(raw, &a); err != nil {
				return fmt.Errorf("xds: handed-over %s %q: %w", t.Short(), name, err)
			}
			r, err := decodeResource(t, &a, in.ResourceVersions[t][name])
			if err == nil {
				err = c.m.mapResource(t, r)
			}
			if err != nil {
				return fmt.Errorf("xds: handed-over state: %w", err)
			}
			ts.accepted[r.name] = r
		}
		ts.version = in.Versions[t]
		ts.updated = in.Updated[t]
		ts.received = true
		for n := range ts.accepted {
			ts.asked[n] = time.Now()
		}
	}
	set := map[TypeURL]map[string]*resource{}
	for t, ts := range c.types {
		set[t] = ts.accepted
	}
	st, err := resolve(set)
	if err != nil {
		return fmt.Errorf("xds: handed-over state: %w", err)
	}
	c.fillVersions(st, set)
	u := &Update{State: st, ack: func(err error) { c.done <- err }}
	select {
	case c.updates <- u:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-c.done:
		if err != nil {
			c.log.Warn("the handed-over xDS state was refused; starting empty", "error", err)
			for _, ts := range c.types {
				ts.accepted, ts.version, ts.received = map[string]*resource{}, "", false
			}
			return nil
		}
		c.delivered = st
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
