package hotrestart

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/hotproxy/hotproxy/internal/unixsock"
)

// refuse tells the peer why, counts it, warns (rate-limited by kind) and
// lets the caller close.
func (p *Parent) refuse(c *conn, kind refusalKind, why string, logArgs ...any) {
	p.refusals[kind].Warn("refused a peer on the restart socket: "+why, logArgs...)
	c.send(&Message{Type: MsgError, Error: why}, nil)
}

// session runs one connection's hand-over from hello to close. It owns the
// connection; the handler is called from here alone.
func (p *Parent) session(uc *net.UnixConn) {
	defer p.wg.Done()
	c := &conn{uc: uc, timeout: p.opts.Timeout}
	defer func() {
		// Closed first, then forgotten: a session counts as open until
		// its descriptor is gone, so whoever waits for the sessions to
		// end (Close, a leak check) never sees a descriptor outlive it.
		// Close may close uc at the same time; a second Close is harmless.
		c.closeGracefully()
		p.mu.Lock()
		delete(p.conns, uc)
		p.mu.Unlock()
	}()

	pid, err := unixsock.Authorize(uc)
	var stranger *unixsock.StrangerError
	switch {
	case errors.As(err, &stranger):
		p.refuse(c, refusedStranger, fmt.Sprintf("peer runs as uid %d; only uid %d or root may take over this generation", stranger.UID, stranger.Self),
			"peer_pid", pid, "peer_uid", stranger.UID)
		return
	case err != nil:
		p.refuse(c, refusedStranger, err.Error())
		return
	}

	m, files, err := c.recv(p.opts.Timeout)
	CloseFiles(files)
	if err != nil {
		p.refuse(c, refusedProtocol, "expected hello: "+err.Error(), "peer_pid", pid)
		return
	}
	if m.Type != MsgHello {
		p.refuse(c, refusedProtocol, fmt.Sprintf("expected hello first, got %s", m.Type), "peer_pid", pid)
		return
	}
	if err := compatible(m.Version); err != nil {
		p.refuse(c, refusedProtocol, err.Error(), "peer_pid", pid)
		return
	}
	child := *m.Identity
	child.PID = pid // the kernel's word, not the peer's
	if err := p.checkSupervised(child, m.Version); err != nil {
		p.refuse(c, refusedUnsupervised, err.Error(), "peer_pid", pid)
		return
	}
	// Only a peer that spoke a valid hello claims the hand-over, so a
	// probe or a garbage peer never blocks a real child.
	p.mu.Lock()
	busy := p.active != nil
	if !busy {
		p.active = uc
	}
	p.mu.Unlock()
	if busy {
		p.refuse(c, refusedBusy, "another generation is already taking over from this one; retry once it has finished", "peer_pid", pid)
		return
	}
	// The slot is freed before the handler hears of the loss and before the
	// connection closes: whoever learns of either may try again at once.
	release := func() {
		p.mu.Lock()
		if p.active == uc {
			p.active = nil
		}
		p.mu.Unlock()
	}
	defer release()
	lost := func(child Identity, drained bool, err error) {
		release()
		p.opts.Handler.ChildLost(child, drained, err)
	}

	self := p.opts.Self
	self.Features = append(slices.Clone(self.Features), FeatureUnusedSockets)
	committer, canCommit := p.opts.Handler.(EarlyCommitter)
	if canCommit {
		self.Features = append(self.Features, FeatureEarlyCommit)
	}
	keySource, hasKeys := p.opts.Handler.(TicketKeySource)
	if hasKeys {
		self.Features = append(self.Features, FeatureSessionTicketKeys)
	}
	xdsSource, hasXDS := p.opts.Handler.(XDSResourceSource)
	if hasXDS {
		self.Features = append(self.Features, FeatureXDSResources)
	}
	if err := c.send(&Message{Type: MsgHello, Version: ProtocolVersion, Identity: &self}, nil); err != nil {
		p.log.Warn("hand-over failed", "child_pid", pid, "error", err)
		return
	}
	p.log.Info("next generation connected", "child_pid", pid, "child_epoch", child.Epoch, "child_version", child.BinaryVersion)

	drained := false
	for {
		m, files, err := c.recv(p.opts.ReadyTimeout)
		CloseFiles(files)
		if err != nil {
			var ne net.Error
			if drained && errors.As(err, &ne) && ne.Timeout() {
				// Once drained, the child keeps the connection open for
				// as long as it lives; silence is normal.
				continue
			}
			if errors.Is(err, errPeerClosed) {
				err = nil
			} else {
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
			}
			lost(child, drained, err)
			return
		}
		switch m.Type {
		case MsgGetSockets:
			if err := p.sendSockets(c); err != nil {
				p.log.Warn("sending sockets failed", "child_pid", pid, "error", err)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
		case MsgGetSessionTicketKeys:
			if !hasKeys {
				err := fmt.Errorf("%s to a parent that did not offer %s", m.Type, FeatureSessionTicketKeys)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
			if err := sendTicketKeys(c, keySource.SessionTicketKeys()); err != nil {
				p.log.Warn("sending session-ticket keys failed", "child_pid", pid, "error", err)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
		case MsgGetXDSResources:
			if !hasXDS {
				err := fmt.Errorf("%s to a parent that did not offer %s", m.Type, FeatureXDSResources)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
			if err := sendXDSResources(c, xdsSource.XDSResources()); err != nil {
				p.log.Warn("sending the xDS resources failed", "child_pid", pid, "error", err)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
		case MsgDrain:
			if !drained {
				drained = true
				p.opts.Handler.Drain(child, m.Unused)
			}
			c.send(&Message{Type: MsgOK}, nil)
		case MsgCommit:
			if !drained || !canCommit {
				err := fmt.Errorf("commit before drain, or to a parent that did not offer %s", FeatureEarlyCommit)
				c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
				lost(child, drained, err)
				return
			}
			committer.Commit(child)
		default:
			err := fmt.Errorf("unexpected %s message after hello", m.Type)
			c.send(&Message{Type: MsgError, Error: err.Error()}, nil)
			lost(child, drained, err)
			return
		}
	}
}

// checkSupervised refuses a child that would leave a supervised service
// unsupervised. A child of this generation's supervisor is let in on the
// kernel's word (its parent pid); a child that says it runs under a
// supervisor of its own (another container's `supervise --take-over`,
// whose pid the kernel may not even show here) is let in on its word: the
// peer already passed the uid check, so the claim guards against a
// mistake, not an attacker. A child of protocol 1.0 cannot say, so one
// the kernel does not show either (an older binary taking over from
// another container) is let in as before. Anything else, typically `serve
// --restart-epoch N` typed into a shell, is refused with what to do.
func (p *Parent) checkSupervised(child Identity, childVersion string) error {
	sup := p.opts.Supervisor
	if sup == 0 {
		return nil
	}
	if child.PID > 0 {
		if ppid, err := parentPID(child.PID); err == nil && ppid == sup {
			return nil
		}
	}
	if slices.Contains(child.Features, FeatureSupervised) {
		return nil
	}
	if child.PID == 0 && childVersion == "1.0" {
		return nil
	}
	peer := "the new process"
	if child.PID > 0 {
		peer = fmt.Sprintf("pid %d", child.PID)
	}
	return fmt.Errorf("this generation runs under a supervisor (pid %d), which did not start %s: "+
		"taking over from it here would leave the service unsupervised (the supervisor exits once its last generation has). "+
		"Reload through the supervisor instead: `hotproxy reload` (with the same --base-id or --control-socket), or `kill -HUP %d`",
		sup, peer, sup)
}

func (p *Parent) sendSockets(c *conn) error {
	sockets, files, err := p.opts.Handler.Sockets()
	defer CloseFiles(files)
	if err != nil {
		return err
	}
	if len(sockets) != len(files) {
		return fmt.Errorf("handler returned %d sockets and %d files", len(sockets), len(files))
	}
	for start := 0; ; start += maxFilesPerMessage {
		end := min(start+maxFilesPerMessage, len(sockets))
		m := &Message{Type: MsgSockets, Sockets: sockets[start:end], More: end < len(sockets)}
		if err := c.send(m, files[start:end]); err != nil {
			return err
		}
		if !m.More {
			return nil
		}
	}
}

// ticketKeysBatchBytes bounds the keys of one message, well under
// maxMessageBytes (a listener of three keys takes about 300 bytes).
const ticketKeysBatchBytes = maxMessageBytes / 2

// sendTicketKeys sends the listeners' keys in as many messages as they
// need, the last with More unset (one empty message when there are none).
func sendTicketKeys(c *conn, keys []ListenerTicketKeys) error {
	var batch []ListenerTicketKeys
	size := 0
	for i, l := range keys {
		n := len(l.Listener) + 100*len(l.Keys) + 50
		if len(batch) > 0 && size+n > ticketKeysBatchBytes {
			if err := c.send(&Message{Type: MsgSessionTicketKeys, TicketKeys: batch, More: true}, nil); err != nil {
				return err
			}
			batch, size = nil, 0
		}
		batch = append(batch, keys[i])
		size += n
	}
	return c.send(&Message{Type: MsgSessionTicketKeys, TicketKeys: batch}, nil)
}

// sendXDSResources sends res as JSON in chunks, the last with More unset
// (one empty message when there is nothing to send).
func sendXDSResources(c *conn, res *XDSResources) error {
	var b []byte
	if res != nil {
		var err error
		if b, err = json.Marshal(res); err != nil {
			return fmt.Errorf("xds_resources: %w", err)
		}
	}
	if len(b) > MaxXDSResourceBytes {
		return fmt.Errorf("xds_resources: %d bytes, more than a child accepts (%d)", len(b), MaxXDSResourceBytes)
	}
	for {
		n := min(len(b), xdsChunkBytes)
		m := &Message{Type: MsgXDSResources, Chunk: b[:n], More: n < len(b)}
		if err := c.send(m, nil); err != nil {
			return err
		}
		b = b[n:]
		if !m.More {
			return nil
		}
	}
}
