package workers

import "time"

// procStart anchors monotonic timestamps.
var procStart = time.Now()

// monotime is nanoseconds since procStart, on the monotonic clock: what
// idle clocks, heartbeats and drains compare.
func monotime() int64 { return int64(time.Since(procStart)) }
