package config

import (
	"fmt"
	"slices"
)

// Overload-manager monitors: what an action's trigger watches. Each
// reports a pressure from 0 to 1.
const (
	// MonitorHeap: the Go heap in use (live objects and garbage not yet
	// swept, runtime/metrics /memory/classes/heap/objects:bytes) against
	// overload.heap_limit_mib.
	MonitorHeap = "heap"
	// MonitorCgroupMemory: the cgroup's memory usage (less its inactive
	// page cache) against its limit (memory.max in cgroup v2,
	// memory.limit_in_bytes in v1). No limit: no pressure.
	MonitorCgroupMemory = "cgroup_memory"
	// MonitorConnections: open client connections against
	// server.max_connections (or the bound derived from the open-file
	// limit).
	MonitorConnections = "connections"
	// MonitorFileDescriptors: open descriptors against RLIMIT_NOFILE.
	MonitorFileDescriptors = "file_descriptors"
)

// OverloadMonitors lists every monitor name.
var OverloadMonitors = []string{MonitorHeap, MonitorCgroupMemory, MonitorConnections, MonitorFileDescriptors}

// Overload configures the overload manager: resource monitors whose
// pressure triggers actions that shed load before the kernel's OOM killer
// or the open-file limit does it less kindly. It is off unless at least
// one action's table is present: a proxy that starts refusing requests
// must have been told to.
type Overload struct {
	// Interval is how often the monitors are read and the triggers
	// evaluated, on the main goroutine.
	Interval Duration `toml:"interval" json:"interval" default:"250ms" bound:"10ms..1m"`
	// HeapLimitMiB is the Go heap the heap monitor measures against;
	// 0 turns the heap monitor off (it reports no pressure).
	HeapLimitMiB int `toml:"heap_limit_mib" json:"heap_limit_mib" bound:"0..1048576" note:"0, the default, turns the heap monitor off"`
	// RetryAfter is the Retry-After of a request refused by
	// refuse_requests.
	RetryAfter Duration `toml:"retry_after" json:"retry_after" default:"5s" bound:"1s..1h"`
	// ResetPerPass bounds how many connections reset_connections resets
	// in one pass (one interval).
	ResetPerPass int `toml:"reset_per_pass" json:"reset_per_pass" default:"16" bound:"1..100000"`
	// ResetMinBusy: reset_connections resets only connections that have
	// held their buffers for at least this long (a quick request is never
	// the one holding memory).
	ResetMinBusy Duration `toml:"reset_min_busy" json:"reset_min_busy" default:"5s" bound:"10ms..1h"`
	// MemoryLimitPercent is the Go memory limit (debug.SetMemoryLimit)
	// that shrink_heap sets, in percent of the smallest memory limit the
	// monitors know (heap_limit_mib, the cgroup's limit).
	MemoryLimitPercent int `toml:"memory_limit_percent" json:"memory_limit_percent" default:"80" bound:"10..100"`
	// TimeoutMinPercent is what shrink_timeouts scales the header and
	// idle timeouts down to at full pressure, in percent.
	TimeoutMinPercent int `toml:"timeout_min_percent" json:"timeout_min_percent" default:"10" bound:"1..100"`

	// The actions; each is off unless its table is present.
	//
	// StopAccepting closes new connections at accept (and counts them).
	StopAccepting *OverloadTrigger `toml:"stop_accepting,omitempty" json:"stop_accepting,omitempty"`
	// RefuseRequests answers new requests 503 with Retry-After.
	RefuseRequests *OverloadTrigger `toml:"refuse_requests,omitempty" json:"refuse_requests,omitempty"`
	// DisableKeepAlive closes HTTP/1.1 connections after their response
	// (Connection: close) and sends HTTP/2 connections a GOAWAY.
	DisableKeepAlive *OverloadTrigger `toml:"disable_keepalive,omitempty" json:"disable_keepalive,omitempty"`
	// ShrinkTimeouts scales the HTTP header and idle timeouts down, to
	// timeout_min_percent at full pressure; connections idle past the
	// shrunk idle timeout are closed.
	ShrinkTimeouts *OverloadTrigger `toml:"shrink_timeouts,omitempty" json:"shrink_timeouts,omitempty"`
	// ShrinkHeap lowers the Go memory limit to memory_limit_percent and
	// returns free memory to the operating system.
	ShrinkHeap *OverloadTrigger `toml:"shrink_heap,omitempty" json:"shrink_heap,omitempty"`
	// ResetConnections resets the client connections that hold the most
	// buffered memory first, at most reset_per_pass per interval.
	ResetConnections *OverloadTrigger `toml:"reset_connections,omitempty" json:"reset_connections,omitempty"`
}

// OverloadTrigger says when an action acts, from the highest pressure of
// its monitors: PressurePercent = [P] acts from P percent on (a threshold);
// [FROM, TO] acts by degrees from FROM to TO percent (a scaled range: an
// action that cannot be done by degrees, like stop_accepting, acts from TO
// on).
type OverloadTrigger struct {
	Monitors        []string `toml:"monitors" json:"monitors" default:"heap,cgroup_memory,connections,file_descriptors"`
	PressurePercent []int    `toml:"pressure_percent" json:"pressure_percent"`
}

// Range returns the trigger as a scaled range in fractions: a threshold P
// is the range [P, P].
func (t *OverloadTrigger) Range() (from, to float64) {
	switch len(t.PressurePercent) {
	case 1:
		f := float64(t.PressurePercent[0]) / 100
		return f, f
	case 2:
		return float64(t.PressurePercent[0]) / 100, float64(t.PressurePercent[1]) / 100
	}
	return 1, 1
}

// Enabled reports whether any action is configured.
func (o Overload) Enabled() bool {
	for _, a := range o.Actions() {
		if a.Trigger != nil {
			return true
		}
	}
	return false
}

// OverloadAction is one action's name and trigger (nil: off).
type OverloadAction struct {
	Name    string
	Trigger *OverloadTrigger
}

// Overload-manager actions, by their key in [overload].
const (
	ActionStopAccepting    = "stop_accepting"
	ActionRefuseRequests   = "refuse_requests"
	ActionDisableKeepAlive = "disable_keepalive"
	ActionShrinkTimeouts   = "shrink_timeouts"
	ActionShrinkHeap       = "shrink_heap"
	ActionResetConnections = "reset_connections"
)

// Actions lists every action, configured or not, in a fixed order.
func (o Overload) Actions() []OverloadAction {
	return []OverloadAction{
		{ActionStopAccepting, o.StopAccepting},
		{ActionRefuseRequests, o.RefuseRequests},
		{ActionDisableKeepAlive, o.DisableKeepAlive},
		{ActionShrinkTimeouts, o.ShrinkTimeouts},
		{ActionShrinkHeap, o.ShrinkHeap},
		{ActionResetConnections, o.ResetConnections},
	}
}

func (v *validator) overload() {
	o := v.c.Overload
	for _, a := range o.Actions() {
		t := a.Trigger
		if t == nil {
			continue
		}
		key := "overload." + a.Name
		p := t.PressurePercent
		switch {
		case len(p) == 1 && p[0] >= 1 && p[0] <= 100:
		case len(p) == 2 && p[0] >= 0 && p[1] <= 100 && p[0] < p[1]:
		default:
			v.ps.add(key+".pressure_percent", "%v: write [P] to act from P percent of pressure on (1 <= P <= 100), or [FROM, TO] to act by degrees between them (0 <= FROM < TO <= 100)", p)
		}
		if len(t.Monitors) == 0 {
			v.ps.add(key+".monitors", "empty: name at least one of %s (or leave the key out for all)", orList(OverloadMonitors))
		}
		for i, m := range t.Monitors {
			if !slices.Contains(OverloadMonitors, m) {
				msg := fmt.Sprintf("%s: unknown monitor (use %s)", quote(m), orList(OverloadMonitors))
				if c := closest(m, OverloadMonitors); c != "" {
					msg = fmt.Sprintf("%s: unknown monitor (did you mean %s?)", quote(m), quote(c))
				}
				v.ps.add(fmt.Sprintf("%s.monitors[%d]", key, i), "%s", msg)
			}
		}
	}
}
