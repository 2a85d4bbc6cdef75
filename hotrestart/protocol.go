// Package hotrestart is the protocol between two generations of hotproxy:
// the next generation (the child) connects to the running one (the parent)
// over a Unix socket, each end checking that the other runs as the same
// user or root (the child before it sends a byte, and, told by its
// supervisor, that the listener is the very process it expects: see
// DialParent), agrees on a protocol version, receives every listening
// socket through SCM_RIGHTS and, once it serves, tells the parent to
// drain. A restart socket's name another user holds is skipped for one of
// its alternates (Addresses).
//
// Each message is one SOCK_SEQPACKET datagram holding a JSON object, with
// the file descriptors it describes attached to it. A datagram keeps its
// boundaries in the kernel, so no length prefix is needed and a message can
// never be read half-way; every read has a deadline and a size bound.
package hotrestart

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ProtocolVersion is spoken by this build: "major.minor". Generations whose
// majors are equal hot restart into each other; a minor bump only adds
// optional fields or features.
//
// 1.1 added the features "supervised" and "unused_sockets"; 1.2 added
// "early_commit" and its message; 1.3 added "session_ticket_keys" and its
// two messages; 1.4 added the link between a generation and its
// supervisor (keeper.go), "kept_sockets" and the keep_sockets message;
// 1.5 added "xds_resources" and its two messages.
const ProtocolVersion = "1.5"

// Defaults for Options fields left zero.
const (
	DefaultTimeout      = 5 * time.Second
	DefaultReadyTimeout = 60 * time.Second
)

// Features a generation lists in its hello.
const (
	// FeatureSupervised: this generation runs under a supervisor (one
	// that started it, see SupervisorFromEnv), which will reap it, reload
	// it and stop it. A supervised generation hands over only to a
	// generation its own supervisor started, or to one that says this.
	FeatureSupervised = "supervised"
	// FeatureUnusedSockets: this parent reads the sockets the child did
	// not take from its drain message (Message.Unused), and closes them
	// once it has emptied their queues instead of keeping them for a
	// rollback. A child lists them only to a parent that says this: an
	// older parent refuses a message with a field it does not know.
	FeatureUnusedSockets = "unused_sockets"
	// FeatureEarlyCommit: this parent reads a commit message from its
	// child (MsgCommit): the child is itself handing over to a newer
	// generation, which supersedes it, so the parent gives up its way
	// back at once instead of at the end of its commit window. A child
	// sends it only to a parent that says this: an older parent takes an
	// unknown message for a broken child, and would roll back.
	FeatureEarlyCommit = "early_commit"
	// FeatureSessionTicketKeys: this parent answers get_session_ticket_keys
	// with the TLS session-ticket keys of its listeners, so that tickets
	// it issued resume on the child. A child asks only a parent that says
	// this: an older one takes an unknown message for a broken child.
	FeatureSessionTicketKeys = "session_ticket_keys"
	// FeatureKeptSockets: spoken on the link between a generation and its
	// supervisor (keeper.go), never on a restart socket. A supervisor that
	// says it keeps a duplicate of every listening socket the serving
	// generation sends it (MsgKeepSockets), and answers get_sockets from
	// the generation it starts after that one died or wedged.
	FeatureKeptSockets = "kept_sockets"
	// FeatureXDSResources: this parent answers get_xds_resources with the
	// dynamic resources it last accepted from its control plane, with
	// their versions (XDSResources), so that the child serves them before
	// it takes the sockets and resumes the xDS stream from them, even
	// while the control plane is down. A child asks only a parent that
	// says this: an older one takes an unknown message for a broken child.
	FeatureXDSResources = "xds_resources"
)

// SupervisorPIDEnv is set by the supervisor in each generation's
// environment to its own pid.
const SupervisorPIDEnv = "HOTPROXY_SUPERVISOR_PID"

// SupervisorFromEnv returns the pid of the supervisor this process runs
// under, or 0 when it runs under none: SupervisorPIDEnv names the pid, and
// that process must still be this one's parent (the variable may have been
// copied into a shell by hand, or the supervisor may have died).
func SupervisorFromEnv() int {
	pid, err := strconv.Atoi(os.Getenv(SupervisorPIDEnv))
	if err != nil || pid <= 0 || pid != os.Getppid() {
		return 0
	}
	return pid
}

// Limits of one message.
const (
	maxMessageBytes = 64 << 10
	// maxFilesPerMessage keeps each batch well under the kernel's
	// SCM_MAX_FD (253).
	maxFilesPerMessage = 32
)

// ErrNotSupported is returned on platforms without Unix-socket fd passing.
var ErrNotSupported = errors.New("hot restart is not supported on this platform")

// ErrGenerationRunning: a generation already listens on the restart
// socket this one wanted.
var ErrGenerationRunning = errors.New("another generation is listening on this restart socket")

// ErrSquatted: every name a generation may listen on (Addresses) is held
// by another user.
var ErrSquatted = errors.New("the restart socket's names are held by another user")

// ErrRefused is wrapped by the errors a peer answered with an error message.
var ErrRefused = errors.New("refused by the other generation")

// MessageType names a message.
type MessageType string

const (
	// hello: child → parent first, then parent → child. Carries versions,
	// features and identities.
	MsgHello MessageType = "hello"
	// get_sockets: child asks for every listening socket.
	MsgGetSockets MessageType = "get_sockets"
	// sockets: parent → child, one batch of socket descriptions with their
	// fds attached; More says another batch follows.
	MsgSockets MessageType = "sockets"
	// drain: child serves; the parent stops accepting and drains.
	MsgDrain MessageType = "drain"
	// commit: child → parent after drain, when the child hands over in
	// turn: the parent commits now (FeatureEarlyCommit). Not answered;
	// the parent's commit closes the connection.
	MsgCommit MessageType = "commit"
	// get_session_ticket_keys: child → parent, once it has its sockets
	// and before it serves (FeatureSessionTicketKeys).
	MsgGetSessionTicketKeys MessageType = "get_session_ticket_keys"
	// session_ticket_keys: parent → child, one batch of listeners' keys;
	// More says another batch follows.
	MsgSessionTicketKeys MessageType = "session_ticket_keys"
	// get_xds_resources: child → parent, after hello and before
	// get_sockets (FeatureXDSResources).
	MsgGetXDSResources MessageType = "get_xds_resources"
	// xds_resources: parent → child, one chunk of the JSON of an
	// XDSResources; More says another chunk follows.
	MsgXDSResources MessageType = "xds_resources"
	// keep_sockets: generation → supervisor on their link, one batch of
	// the generation's listening sockets with their fds attached; More
	// says another batch follows. The last batch replaces whatever the
	// supervisor kept before. Not answered.
	MsgKeepSockets MessageType = "keep_sockets"
	// ok: a request was done.
	MsgOK MessageType = "ok"
	// error: a request was refused; the connection closes after it.
	MsgError MessageType = "error"
)

// Socket describes one listening socket passed between generations.
type Socket struct {
	Network string `json:"network"` // "tcp"
	Address string `json:"address"` // as configured, e.g. "127.0.0.1:8080"
	Worker  int    `json:"worker"`  // owning worker, -1 when shared
	// Role tells a listener's sockets from the admin API's.
	Role string `json:"role"`
	// Name is the listener's name, for messages.
	Name string `json:"name,omitempty"`
}

// Socket roles.
const (
	RoleListener = "listener"
	RoleAdmin    = "admin"
)

// ListenerTicketKeys are one listener's TLS session-ticket keys, the one
// that encrypts new tickets first.
type ListenerTicketKeys struct {
	Listener string      `json:"listener"`
	Keys     []TicketKey `json:"keys"`
	// Next is the key the parent's next rotation will make the encrypting
	// one, made in advance: the child rotates to it too, and accepts it
	// already, so a rotation during the hand-over loses no ticket.
	Next *TicketKey `json:"next,omitempty"`
}

// TicketKey is one session-ticket key. It is a secret: whoever holds it
// can decrypt the sessions its tickets carry. It only crosses the restart
// socket, whose peer is checked to run as the same user, and is never
// logged (String hides it).
type TicketKey struct {
	Key []byte `json:"key"` // TicketKeySize bytes (base64 in JSON)
	// Created is when the key was made (Unix nanoseconds), so that the
	// child rotates it on the same schedule.
	Created int64 `json:"created"`
}

// TicketKeySize is the size of a session-ticket key.
const TicketKeySize = 32

// maxTicketKeysPerListener bounds what a child accepts per listener.
const maxTicketKeysPerListener = 8

// String keeps a key out of logs and error messages.
func (k TicketKey) String() string {
	return fmt.Sprintf("{key:(%d secret bytes) created:%d}", len(k.Key), k.Created)
}

// GoString keeps a key out of %#v too.
func (k TicketKey) GoString() string { return k.String() }

// Identity is what a generation says of itself in hello.
type Identity struct {
	PID           int      `json:"pid"`
	Epoch         int      `json:"epoch"`
	BinaryVersion string   `json:"binary_version"`
	Features      []string `json:"features,omitempty"`
	// FirstStart is when epoch 0 started (Unix nanoseconds), so uptime
	// over all epochs survives restarts. Set by the parent.
	FirstStart int64 `json:"first_start,omitempty"`
}

// Message is everything that crosses the socket.
type Message struct {
	Type MessageType `json:"type"`

	// hello
	Version  string    `json:"version,omitempty"`
	Identity *Identity `json:"identity,omitempty"`

	// sockets: one entry per attached fd, in order.
	Sockets []Socket `json:"sockets,omitempty"`
	More    bool     `json:"more,omitempty"`

	// drain: the sockets handed over that the child did not take (a
	// listener removed or moved), sent only to a parent with
	// FeatureUnusedSockets.
	Unused []Socket `json:"unused,omitempty"`

	// session_ticket_keys: some listeners' keys; More as for sockets.
	TicketKeys []ListenerTicketKeys `json:"ticket_keys,omitempty"`

	// xds_resources: a chunk of the JSON of an XDSResources (base64 in
	// the message's JSON); More as for sockets.
	Chunk []byte `json:"chunk,omitempty"`

	// error
	Error string `json:"error,omitempty"`
}

// XDSResources are the dynamic resources a generation last accepted from
// its control plane, as the control plane sent them, with their versions:
// what FeatureXDSResources hands to the child. Types are xDS type URLs.
type XDSResources struct {
	// Versions is each type's accepted version_info.
	Versions map[string]string `json:"versions,omitempty"`
	// Updated is when each type last changed (Unix nanoseconds).
	Updated map[string]int64 `json:"updated,omitempty"`
	// Resources are every accepted resource.
	Resources []XDSResource `json:"resources"`
}

// XDSResource is one resource: a serialized google.protobuf.Any. It may
// hold a secret (a private key): it only crosses the restart socket,
// whose peer is checked to run as the same user.
type XDSResource struct {
	Type string `json:"type"`
	Name string `json:"name"`
	// Version is the resource's own version (delta xDS), if any.
	Version string `json:"version,omitempty"`
	Any     []byte `json:"any"`
}

// Bounds of the xds_resources messages: a chunk fits a datagram once in
// base64, and what a child accepts in all is bounded.
const (
	xdsChunkBytes       = 32 << 10
	MaxXDSResourceBytes = 64 << 20
)

// decodeXDSResources parses the reassembled JSON of an XDSResources
// strictly.
func decodeXDSResources(b []byte) (*XDSResources, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var r XDSResources
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("malformed xds_resources: %w", err)
	}
	if dec.More() {
		return nil, errors.New("malformed xds_resources: trailing data after the JSON object")
	}
	for i, res := range r.Resources {
		if res.Type == "" || res.Name == "" || len(res.Any) == 0 {
			return nil, fmt.Errorf("malformed xds_resources: resource %d (type %q, name %q, %d bytes) lacks a type, a name or its bytes",
				i, res.Type, res.Name, len(res.Any))
		}
	}
	return &r, nil
}

// decodeMessage parses one datagram strictly: unknown fields and unknown
// types are errors, never guesses.
func decodeMessage(b []byte) (*Message, error) {
	if len(b) == 0 {
		return nil, errors.New("empty message")
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var m Message
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("malformed message: %w", err)
	}
	if dec.More() {
		return nil, errors.New("malformed message: trailing data after the JSON object")
	}
	switch m.Type {
	case MsgHello:
		if m.Identity == nil || m.Version == "" {
			return nil, errors.New("malformed hello: version and identity are required")
		}
	case MsgSockets, MsgKeepSockets:
		for i, s := range m.Sockets {
			if s.Network == "" || s.Address == "" || (s.Role != RoleListener && s.Role != RoleAdmin) {
				return nil, fmt.Errorf("malformed %s message: entry %d (%+v) lacks network, address or a known role", m.Type, i, s)
			}
		}
	case MsgDrain:
		for i, s := range m.Unused {
			if s.Network == "" || s.Address == "" {
				return nil, fmt.Errorf("malformed drain message: unused entry %d (%+v) lacks network or address", i, s)
			}
		}
	case MsgSessionTicketKeys:
		for i, l := range m.TicketKeys {
			if l.Listener == "" || len(l.Keys) == 0 || len(l.Keys) > maxTicketKeysPerListener {
				return nil, fmt.Errorf("malformed session_ticket_keys message: entry %d (listener %q) needs a listener name and 1 to %d keys, has %d",
					i, l.Listener, maxTicketKeysPerListener, len(l.Keys))
			}
			keys := l.Keys
			if l.Next != nil {
				keys = append(slices.Clone(keys), *l.Next)
			}
			for j, k := range keys {
				if len(k.Key) != TicketKeySize || k.Created <= 0 {
					return nil, fmt.Errorf("malformed session_ticket_keys message: listener %q key %d is %d bytes made at %d (want %d bytes and a time)",
						l.Listener, j, len(k.Key), k.Created, TicketKeySize)
				}
			}
		}
	case MsgXDSResources:
		if len(m.Chunk) > xdsChunkBytes {
			return nil, fmt.Errorf("malformed xds_resources message: a chunk of %d bytes (at most %d)", len(m.Chunk), xdsChunkBytes)
		}
	case MsgGetSockets, MsgGetSessionTicketKeys, MsgGetXDSResources, MsgOK, MsgError, MsgCommit:
	case "":
		return nil, errors.New("malformed message: no type")
	default:
		return nil, fmt.Errorf("unknown message type %q", m.Type)
	}
	return &m, nil
}

// majorOf returns the major number of a "major.minor" version.
func majorOf(v string) (int, error) {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("unparsable protocol version %q", v)
	}
	return n, nil
}

// compatible reports whether a peer speaking theirs can hot restart with
// this build, and if not, why and what to do.
func compatible(theirs string) error {
	ours, _ := majorOf(ProtocolVersion)
	their, err := majorOf(theirs)
	if err != nil {
		return err
	}
	if their != ours {
		return fmt.Errorf("hot-restart protocol %s is incompatible with %s (major versions differ): "+
			"stop the running generation and start the new binary cold, or upgrade through a release that speaks both", theirs, ProtocolVersion)
	}
	return nil
}

// errPeerClosed: the other end closed the connection.
var errPeerClosed = errors.New("the other generation closed the connection")
