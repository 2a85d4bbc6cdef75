package hotrestart

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// Child is the next generation's end of a hand-over.
type Child struct {
	c      *conn
	parent Identity
}

// ErrNoParent means nothing listens at the parent's address: no
// generation of that epoch is running.
var ErrNoParent = errors.New("no running generation to take over from")

// Dial connects to the parent at addr and exchanges hello. timeout bounds
// every read and write (DefaultTimeout when 0).
func Dial(addr string, self Identity, timeout time.Duration) (*Child, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	uc, err := dial(addr, timeout)
	if err != nil {
		if errors.Is(err, ErrNotSupported) {
			return nil, err
		}
		return nil, fmt.Errorf("restart socket %s: %w (%v)", addr, ErrNoParent, err)
	}
	c := &conn{uc: uc, timeout: timeout}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &self}, nil); err != nil {
		uc.Close()
		return nil, err
	}
	m, err := c.expect(MsgHello)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if err := compatible(m.Version); err != nil {
		uc.Close()
		return nil, err
	}
	return &Child{c: c, parent: *m.Identity}, nil
}

// expect reads one message of type want; an error message from the peer
// becomes an error wrapping ErrRefused.
func (c *conn) expect(want MessageType) (*Message, error) {
	m, files, err := c.recv(0)
	if err != nil {
		return nil, err
	}
	if m.Type == MsgError {
		CloseFiles(files)
		return nil, fmt.Errorf("%w: %s", ErrRefused, m.Error)
	}
	if m.Type != want {
		CloseFiles(files)
		return nil, fmt.Errorf("expected %s, got %s", want, m.Type)
	}
	if len(files) > 0 {
		CloseFiles(files)
		return nil, fmt.Errorf("%s message carried unexpected fds", m.Type)
	}
	return m, nil
}

// Parent is what the parent said of itself in hello.
func (ch *Child) Parent() Identity { return ch.parent }

// Sockets asks for every listening socket. The caller owns the files.
func (ch *Child) Sockets() ([]Socket, []*os.File, error) {
	if err := ch.c.send(&Message{Type: MsgGetSockets}, nil); err != nil {
		return nil, nil, err
	}
	var sockets []Socket
	var files []*os.File
	for {
		m, fs, err := ch.c.recv(0)
		if err != nil {
			CloseFiles(files)
			return nil, nil, err
		}
		switch m.Type {
		case MsgError:
			CloseFiles(fs)
			CloseFiles(files)
			return nil, nil, fmt.Errorf("%w: %s", ErrRefused, m.Error)
		case MsgSockets:
		default:
			CloseFiles(fs)
			CloseFiles(files)
			return nil, nil, fmt.Errorf("expected sockets, got %s", m.Type)
		}
		sockets = append(sockets, m.Sockets...)
		files = append(files, fs...)
		if !m.More {
			return sockets, files, nil
		}
	}
}

// SessionTicketKeys asks the parent for its listeners' TLS session-ticket
// keys. offered is false, and nothing is asked, when the parent does not
// offer FeatureSessionTicketKeys (an older binary): this generation makes
// keys of its own, and clients do one full handshake. Call it after
// Sockets and before Drain, and install the keys before serving.
func (ch *Child) SessionTicketKeys() (keys []ListenerTicketKeys, offered bool, err error) {
	if !slices.Contains(ch.parent.Features, FeatureSessionTicketKeys) {
		return nil, false, nil
	}
	if err := ch.c.send(&Message{Type: MsgGetSessionTicketKeys}, nil); err != nil {
		return nil, true, err
	}
	for {
		m, err := ch.c.expect(MsgSessionTicketKeys)
		if err != nil {
			return nil, true, err
		}
		keys = append(keys, m.TicketKeys...)
		if !m.More {
			return keys, true, nil
		}
	}
}

// Drain tells the parent this generation serves: the parent stops
// accepting and drains. unused are the sockets it handed over that this
// generation did not take; a parent that understands it (an older one
// does not, and is not told) closes them as soon as their queues are
// empty, so that no connection waits in a socket nobody will accept on.
// The connection stays open afterwards, so the parent learns if this
// generation dies.
func (ch *Child) Drain(unused []Socket) error {
	m := &Message{Type: MsgDrain}
	if slices.Contains(ch.parent.Features, FeatureUnusedSockets) {
		m.Unused = unused
	}
	if err := ch.c.send(m, nil); err != nil {
		return err
	}
	_, err := ch.c.expect(MsgOK)
	return err
}

// Commit tells the parent to commit its hand-over now: this generation is
// handing over in turn to a newer one, which supersedes it. A parent that
// does not offer FeatureEarlyCommit is not told (it commits at the end of
// its window). Safe to call while AwaitRelease runs; after the parent has
// let go, it fails harmlessly.
func (ch *Child) Commit() error {
	if !slices.Contains(ch.parent.Features, FeatureEarlyCommit) {
		return nil
	}
	return ch.c.send(&Message{Type: MsgCommit}, nil)
}

// AwaitRelease blocks until the parent closes the connection — it has
// committed the hand-over or exited — and then closes this end, so the
// new generation holds nothing of the old one's. It returns early with an
// error if anything but a close arrives.
func (ch *Child) AwaitRelease() error {
	defer ch.c.uc.Close()
	for {
		m, files, err := ch.c.recv(time.Hour)
		CloseFiles(files)
		var ne interface{ Timeout() bool }
		switch {
		case errors.Is(err, errPeerClosed):
			return nil
		case errors.As(err, &ne) && ne.Timeout():
			continue
		case err != nil:
			return err
		default:
			return fmt.Errorf("unexpected %s message after the hand-over", m.Type)
		}
	}
}

// Close ends the hand-over connection.
func (ch *Child) Close() error { return ch.c.uc.Close() }
