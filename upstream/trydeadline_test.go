package upstream

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hotproxy/hotproxy/config"
)

// dialRaw is a Conn to a listener whose accepted side the test holds.
func dialRaw(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wc := newWorkerCluster(t, config.Cluster{Endpoints: []string{ln.Addr().String()}}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wc.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(c.Discard)
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// A try's deadlines are moved only when the ones set for the try before
// are earlier than the new try's or more than the slack later: set at
// t+slack, never at less than the try's own deadline.
func TestSetTryDeadlineMovesOnlyOutsideTheSlack(t *testing.T) {
	c, _ := dialRaw(t)
	const slack = 10 * time.Millisecond
	base := time.Now().Add(time.Hour)
	steps := []struct {
		try  time.Duration // the try's deadline, after base
		want time.Duration // the deadline set, after base
	}{
		{0, slack},                    // none yet: set at t+slack
		{4 * time.Millisecond, slack}, // inside the slack: kept
		{slack, slack},                // at its edge: kept
		{slack + 1, 2*slack + 1},      // later than the one set: moved
		{-time.Millisecond, slack - time.Millisecond}, // the one set is more than slack later: moved
	}
	for _, s := range steps {
		c.SetTryDeadline(base.Add(s.try), slack)
		if got := time.Duration(c.tryDeadline.Load() - base.UnixNano()); got != s.want {
			t.Errorf("try deadline base%+v: deadlines at base%+v, want base%+v", s.try, got, s.want)
		}
	}
}

// Any other deadline set in between (a body's read deadline, a per-try
// timeout's hand-back) makes the next try set its own: the socket's
// deadlines are no longer the ones the try before left.
func TestSetTryDeadlineAfterAnotherDeadline(t *testing.T) {
	for name, other := range map[string]func(*Conn, time.Time) error{
		"SetDeadline":      (*Conn).SetDeadline,
		"SetReadDeadline":  (*Conn).SetReadDeadline,
		"SetWriteDeadline": (*Conn).SetWriteDeadline,
	} {
		t.Run(name, func(t *testing.T) {
			c, peer := dialRaw(t)
			if _, err := peer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			try := time.Now().Add(time.Hour)
			c.SetTryDeadline(try, 10*time.Millisecond)
			other(c, time.Unix(1, 0)) // in the past: the next I/O would time out
			c.SetTryDeadline(try.Add(time.Millisecond), 10*time.Millisecond)
			if _, err := c.Read(make([]byte, 1)); err != nil {
				t.Errorf("read after the next try set its deadlines: %v", err)
			}
			if _, err := c.Write([]byte("y")); err != nil {
				t.Errorf("write after the next try set its deadlines: %v", err)
			}
		})
	}
}

// A try never times out before its own deadline, which a deadline kept
// from the try before (inside the slack) is not earlier than.
func TestSetTryDeadlineNeverEarly(t *testing.T) {
	c, _ := dialRaw(t)
	start := time.Now()
	first := start.Add(50 * time.Millisecond)
	c.SetTryDeadline(first, 20*time.Millisecond)
	second := first.Add(15 * time.Millisecond) // kept: first+20ms covers it
	c.SetTryDeadline(second, 20*time.Millisecond)
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent: %v, want a timeout", err)
	}
	if now := time.Now(); now.Before(second) {
		t.Errorf("the try timed out %v before its deadline", second.Sub(now))
	}
}
