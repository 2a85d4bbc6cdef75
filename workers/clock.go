package workers

import httpfront "github.com/hotproxy/hotproxy/downstream/http"

// monotime is nanoseconds since the process started, on the monotonic
// clock: what idle clocks, heartbeats and drains compare. One clock with
// the HTTP front end's, which stamps a connection's idle start.
func monotime() int64 { return httpfront.Monotime() }
