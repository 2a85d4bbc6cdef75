package config

import (
	"strings"
	"time"
)

// MaxConcurrency bounds server.concurrency.
const MaxConcurrency = 1024

// MaxConnectionsLimit bounds server.max_connections and a listener's
// max_connections: 16 Mi connections, past what a process can hold (each
// is a descriptor and kernel buffers; fs.nr_open is 1 Mi by default).
const MaxConnectionsLimit = 1 << 24

// Every integer and duration key declares its range with a bound tag on
// its field (declare.go): what the code that consumes it can honour.
// Minimums keep a timer from firing so often that it burns a core (a
// ticker at "1ns") or from cutting every connection before it can do
// anything; maximums keep values where sums of them (the supervisor adds
// commit_window, parent_shutdown_time and a margin) cannot overflow, and
// catch a unit typed wrong ("30000h"). A test checks that every integer
// and duration of the schema has one.

// shortDuration writes d without zero units: "5m", "168h", "1m30s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
