package xds

import (
	"context"
	"fmt"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// response is one DiscoveryResponse or DeltaDiscoveryResponse, decoded.
type response struct {
	typeURL TypeURL
	version string
	nonce   string
	// resources are the resources it carries, by name. For SotW, the
	// set of the wildcard types (LDS, CDS) is the whole state.
	resources map[string]*resource
	removed   []string
	delta     bool
	// stream is the stream it came on: its ACK is only sent there.
	stream int
}

// request is what the client tells the server about one type.
type request struct {
	typeURL TypeURL
	// version is the last accepted version_info (SotW).
	version string
	nonce   string
	// names are the resources wanted; wildcard: all of them.
	names    []string
	wildcard bool
	// initial are the versions held (delta, first request of the type).
	initial map[string]string
	nack    error
}

// wire is one ADS stream, SotW or delta.
type wire interface {
	send(r request) error
	recv() (*response, error)
}

func newWire(ctx context.Context, conn *grpc.ClientConn, p Protocol, node *corev3.Node) (wire, error) {
	c := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	if p == ProtocolSotW {
		s, err := c.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, fmt.Errorf("xds: opening the ADS stream: %w", err)
		}
		return &sotwWire{s: s, node: node}, nil
	}
	s, err := c.DeltaAggregatedResources(ctx)
	if err != nil {
		return nil, fmt.Errorf("xds: opening the delta ADS stream: %w", err)
	}
	return &deltaWire{s: s, node: node, subscribed: map[TypeURL]map[string]bool{}}, nil
}

func errorDetail(err error) *statuspb.Status {
	if err == nil {
		return nil
	}
	return &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

type sotwWire struct {
	s        discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node     *corev3.Node
	sentNode bool
}

func (w *sotwWire) send(r request) error {
	req := &discoveryv3.DiscoveryRequest{
		VersionInfo:   r.version,
		TypeUrl:       string(r.typeURL),
		ResponseNonce: r.nonce,
		ErrorDetail:   errorDetail(r.nack),
	}
	if !r.wildcard {
		req.ResourceNames = r.names
	}
	if !w.sentNode {
		req.Node, w.sentNode = w.node, true
	}
	return w.s.Send(req)
}

func (w *sotwWire) recv() (*response, error) {
	m, err := w.s.Recv()
	if err != nil {
		return nil, err
	}
	out := &response{typeURL: TypeURL(m.GetTypeUrl()), version: m.GetVersionInfo(), nonce: m.GetNonce(), resources: map[string]*resource{}}
	for _, a := range m.GetResources() {
		r, err := decodeResource(out.typeURL, a, "")
		if err != nil {
			return out, err
		}
		out.resources[r.name] = r
	}
	return out, nil
}

type deltaWire struct {
	s          discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node       *corev3.Node
	sentNode   bool
	subscribed map[TypeURL]map[string]bool // names subscribed on this stream, per type
}

func (w *deltaWire) send(r request) error {
	req := &discoveryv3.DeltaDiscoveryRequest{
		TypeUrl:       string(r.typeURL),
		ResponseNonce: r.nonce,
		ErrorDetail:   errorDetail(r.nack),
	}
	if !w.sentNode {
		req.Node, w.sentNode = w.node, true
	}
	sub, first := w.subscribed[r.typeURL]
	if !first {
		sub = map[string]bool{}
		w.subscribed[r.typeURL] = sub
		req.InitialResourceVersions = r.initial
	}
	want := r.names
	if r.wildcard {
		want = []string{"*"}
	}
	for _, n := range want {
		if !sub[n] {
			req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, n)
			sub[n] = true
		}
	}
	for n := range sub {
		if !slices.Contains(want, n) {
			req.ResourceNamesUnsubscribe = append(req.ResourceNamesUnsubscribe, n)
			delete(sub, n)
		}
	}
	slices.Sort(req.ResourceNamesUnsubscribe)
	return w.s.Send(req)
}

func (w *deltaWire) recv() (*response, error) {
	m, err := w.s.Recv()
	if err != nil {
		return nil, err
	}
	out := &response{typeURL: TypeURL(m.GetTypeUrl()), version: m.GetSystemVersionInfo(), nonce: m.GetNonce(),
		resources: map[string]*resource{}, removed: m.GetRemovedResources(), delta: true}
	for _, res := range m.GetResources() {
		if res.GetResource() == nil {
			continue // a name the server does not have (an answer to a subscription)
		}
		r, err := decodeResource(out.typeURL, res.GetResource(), res.GetVersion())
		if err != nil {
			return out, err
		}
		if res.GetName() != "" && res.GetName() != r.name {
			return out, fmt.Errorf("%s: resource named %q holds %q", out.typeURL.Short(), res.GetName(), r.name)
		}
		out.resources[r.name] = r
	}
	return out, nil
}

// resource is one resource as received: its Any, its decoded message, its
// mapping once mapped.
type resource struct {
	name    string
	version string // delta: the resource's own version
	raw     []byte // the Any, serialized (deterministic)
	msg     proto.Message
	mapped  any
}

// decodeResource unpacks an Any of type t. An error here is a malformed
// response, which is NACKed like a refused resource.
func decodeResource(t TypeURL, a *anypb.Any, version string) (*resource, error) {
	if TypeURL(a.GetTypeUrl()) != t {
		return nil, fmt.Errorf("%s response holds a resource of type %s", t.Short(), a.GetTypeUrl())
	}
	msg, err := a.UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("%s: undecodable resource: %w", t.Short(), err)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Short(), err)
	}
	r := &resource{version: version, raw: raw, msg: msg}
	type named interface{ GetName() string }
	switch m := msg.(type) {
	case interface{ GetClusterName() string }: // ClusterLoadAssignment
		r.name = m.GetClusterName()
	case named:
		r.name = m.GetName()
	}
	if r.name == "" {
		return nil, fmt.Errorf("%s: a resource without a name", t.Short())
	}
	return r, nil
}
