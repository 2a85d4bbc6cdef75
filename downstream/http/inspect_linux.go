package httpfront

// IdlePollerSlots says how many slots the worker's idle poller has handed
// out, how many of them are free again, and whether it was started (at
// a first park): for the worker's tests of parked connections' ends.
func (w *Worker) IdlePollerSlots() (slots, free int, started bool) {
	p := &w.idle
	p.mu.Lock()
	defer p.mu.Unlock()
	return int(p.nslots), len(p.free), p.started
}
