// Package ratelog keeps a warning that an outsider can trigger at will (a
// refused peer, a failed accept) from flooding the log: one line per
// interval, carrying how many were held back since the last.
package ratelog

import (
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// DefaultEvery is the interval of a Limiter whose Every is zero.
const DefaultEvery = 10 * time.Second

// Limiter logs one warning per interval. The zero value is ready to use
// with a null logger; safe for concurrent use, and lock-free.
type Limiter struct {
	Log   hclog.Logger  // nil: nothing is logged (counting still works)
	Every time.Duration // zero: DefaultEvery

	next       atomic.Int64  // unix nanoseconds before which lines are held back
	suppressed atomic.Uint64 // held back since the last line logged
	total      atomic.Uint64 // every call, logged or not
}

// Warn logs msg with args unless a line was logged less than Every ago;
// the line carries "suppressed", the number held back since the previous
// one. It reports whether the line was logged.
func (l *Limiter) Warn(msg string, args ...any) bool {
	l.total.Add(1)
	now := time.Now().UnixNano()
	next := l.next.Load()
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	if now < next || !l.next.CompareAndSwap(next, now+int64(every)) {
		l.suppressed.Add(1)
		return false
	}
	held := l.suppressed.Swap(0)
	if l.Log != nil {
		if held > 0 {
			args = append(args, "suppressed", held)
		}
		l.Log.Warn(msg, args...)
	}
	return true
}

// Total is the number of Warn calls, logged or held back.
func (l *Limiter) Total() uint64 { return l.total.Load() }
