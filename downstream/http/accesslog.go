package httpfront

import "github.com/hotproxy/hotproxy/internal/accesslog"

// EnqueueRecord hands a finished record to every log of the listener,
// whichever front end filled it; a full queue drops it, counted in the
// listener's access_log.dropped (st.LogDropped), without waiting. The
// logs copy r: the caller reuses it.
func EnqueueRecord(logs []*accesslog.Logger, r *accesslog.Record, st *Stats) {
	for _, l := range logs {
		if !l.Enqueue(r) {
			st.LogDropped.Inc()
		}
	}
}
