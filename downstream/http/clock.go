package httpfront

import "time"

// procStart anchors monotonic timestamps.
var procStart = time.Now()

// Monotime is nanoseconds since the process started, on the monotonic
// clock: what idle clocks, heartbeats and drains compare (the worker's
// drain compares a connection's idle time, IdleFor, with it).
func Monotime() int64 { return int64(time.Since(procStart)) }

// monotimeOf is t as Monotime, without reading the clock: t must be a
// time.Now (or derived from one by Add), whose monotonic reading Sub
// uses.
func monotimeOf(t time.Time) int64 { return int64(t.Sub(procStart)) }
