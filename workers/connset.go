package workers

import (
	"io"
	"sync"
	"time"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
)

// connSet is a worker's client connections (HTTP, upgraded HTTP, TCP
// sessions), so that a drain can wait for them, close the idle ones and
// close the rest at its deadline. Touched once when a connection starts and
// once when it ends, by that worker's connections only: never per request.
type connSet struct {
	mu sync.Mutex // guards m and killed
	// m holds each connection with its listener, so that a listener
	// can drain alone (update.go).
	m      map[io.Closer]*mlistener
	killed bool
	// idle is the front end's state of the set's worker, whose idle
	// poller parks idle HTTP/1.1 connections (they stay in m while
	// parked): killAll stops it, after closing them.
	idle interface{ CloseIdlePoller() }
}

// add registers c, a connection of listener ml; false means the set was
// killed and c must be closed.
func (s *connSet) add(c io.Closer, ml *mlistener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.killed {
		return false
	}
	if s.m == nil {
		s.m = make(map[io.Closer]*mlistener)
	}
	s.m[c] = ml
	return true
}

func (s *connSet) remove(c io.Closer) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// closeIdle closes the HTTP connections idle between requests for at least
// grace and returns how many connections remain: of listener only, or of
// all listeners when only is nil.
func (s *connSet) closeIdle(now int64, grace time.Duration, only *mlistener) int {
	var idle []*httpfront.Conn
	left := 0
	s.mu.Lock()
	for c, ml := range s.m {
		if only != nil && ml != only {
			continue
		}
		if tc, ok := c.(*httpfront.Conn); ok && tc.IdleFor(now) >= grace {
			idle = append(idle, tc)
			continue
		}
		left++
	}
	s.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
	return left
}

// closeHTTP closes every HTTP connection in the set (of listener only;
// nil: of all), busy or not, and returns how many.
func (s *connSet) closeHTTP(only *mlistener) int {
	var cs []*httpfront.Conn
	s.mu.Lock()
	for c, ml := range s.m {
		if only != nil && ml != only {
			continue
		}
		if tc, ok := c.(*httpfront.Conn); ok {
			cs = append(cs, tc)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}

// closeListener closes every connection of listener ml in the set, HTTP
// or not, and returns how many: the end of ml's drain alone. The others
// and the worker's idle poller stay as they are.
func (s *connSet) closeListener(ml *mlistener) int {
	var cs []io.Closer
	s.mu.Lock()
	for c, l := range s.m {
		if l == ml {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}

// killAll closes every connection in the set, and any added later.
func (s *connSet) killAll() int {
	s.mu.Lock()
	s.killed = true
	cs := make([]io.Closer, 0, len(s.m))
	for c := range s.m {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	// Every parked connection has been handed to a resumer by its Close.
	if s.idle != nil {
		s.idle.CloseIdlePoller()
	}
	return len(cs)
}
