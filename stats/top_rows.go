package stats

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/hotproxy/hotproxy/shm"
)

// topRow is one listener or cluster of a frame. Rates are NaN before the
// second snapshot; quantiles NaN when the interval recorded no sample.
type topRow struct {
	name          string
	rate          float64 // requests per second
	errRate       float64 // listener: 5xx per second; cluster: failed connects per second
	active        int64   // open connections
	rx, tx        float64 // bytes per second (listeners)
	healthy, size int64   // cluster membership
	p50, p90, p99 float64 // ms, over the last interval
}

// statsByName indexes a snapshot.
func statsByName(s *shm.Snapshot) map[string]shm.Stat {
	if s == nil {
		return map[string]shm.Stat{}
	}
	m := make(map[string]shm.Stat, len(s.Stats))
	for _, st := range s.Stats {
		m[st.Name] = st
	}
	return m
}

// groupNames is the names of the groups (listeners or clusters) of a
// snapshot: <name> of every stat named prefix + <name> + marker that is
// not retired.
func groupNames(s *shm.Snapshot, prefix, marker string) []string {
	set := map[string]bool{}
	for _, st := range s.Stats {
		if st.Retired {
			continue // of a listener or cluster no live generation has
		}
		if rest, ok := strings.CutPrefix(st.Name, prefix); ok {
			if i := strings.Index(rest, marker); i > 0 {
				set[rest[:i]] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (t *Top) listeners() []topRow {
	if t.cur == nil {
		return nil
	}
	iv := t.interval()
	var rows []topRow
	for _, n := range groupNames(t.cur, "listener.", ".downstream_") {
		if t.Filter != nil && !t.Filter.MatchString(n) {
			continue
		}
		p := "listener." + n + "."
		r := topRow{name: n, rate: iv.rate(p + "downstream_rq_total"), errRate: iv.rate(p + "downstream_rq_5xx"),
			active: iv.gauge(p + "downstream_cx_active"),
			rx:     iv.rate(p + "downstream_cx_rx_bytes_total"), tx: iv.rate(p + "downstream_cx_tx_bytes_total")}
		if _, http := iv.cur[p+"downstream_rq_total"]; !http {
			// A TCP listener: connections are its requests.
			r.rate = iv.rate(p + "downstream_cx_total")
		}
		r.p50, r.p90, r.p99 = iv.quantiles(p + "downstream_rq_time")
		rows = append(rows, r)
	}
	t.sortRows(rows)
	return rows
}

func (t *Top) clusters() []topRow {
	if t.cur == nil {
		return nil
	}
	iv := t.interval()
	var rows []topRow
	for _, n := range groupNames(t.cur, "cluster.", ".upstream_") {
		if t.Filter != nil && !t.Filter.MatchString(n) {
			continue
		}
		p := "cluster." + n + "."
		r := topRow{name: n, rate: iv.rate(p + "upstream_rq_total"), errRate: iv.rate(p + "upstream_cx_connect_fail"),
			active: iv.gauge(p + "upstream_cx_active"), healthy: iv.gauge(p + "membership_healthy"), size: iv.gauge(p + "membership_total")}
		r.p50, r.p90, r.p99 = iv.quantiles(p + "upstream_rq_time")
		rows = append(rows, r)
	}
	t.sortRows(rows)
	return rows
}

func (t *Top) sortRows(rows []topRow) {
	// NaN sorts last whatever the order.
	key := func(r topRow) float64 {
		switch t.Sort {
		case SortByRate:
			return r.rate
		case SortByLatency:
			return r.p99
		}
		return 0
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if t.Sort == SortByName {
			return rows[i].name < rows[j].name
		}
		a, b := key(rows[i]), key(rows[j])
		if math.IsNaN(a) != math.IsNaN(b) {
			return !math.IsNaN(a)
		}
		if a != b {
			return a > b
		}
		return rows[i].name < rows[j].name
	})
}

// overloadLines is the OVERLOAD section of a frame: the overload
// manager's monitors and actions (server/overload.go), or nothing when no
// generation has one. One line of monitors' pressure, one of actions:
//
//	PRESSURE  heap 41%  cgroup_memory 12%  connections 3%  file_descriptors 1%
//	ACTIONS   stop_accepting ON  reset_connections ON  shrink_timeouts 40%  shed/s 120
func (t *Top) overloadLines() []string {
	if t.cur == nil {
		return nil
	}
	iv := t.interval()
	monitors := groupNames(t.cur, "overload.monitor.", ".pressure_percent")
	actions := groupNames(t.cur, "overload.", ".scale_percent")
	if len(monitors) == 0 && len(actions) == 0 {
		return nil
	}
	p := "PRESSURE "
	for _, m := range monitors {
		p += "  " + m + " " + strconv.FormatInt(iv.gauge("overload.monitor."+m+".pressure_percent"), 10) + "%"
	}
	a := "ACTIONS  "
	for _, n := range actions {
		switch {
		case iv.gauge("overload."+n+".active") == 1 && n == "shrink_timeouts":
			a += "  " + n + " " + strconv.FormatInt(iv.gauge("overload."+n+".scale_percent"), 10) + "%"
		case iv.gauge("overload."+n+".active") == 1:
			a += "  " + n + " ON"
		default:
			a += "  " + n + " off"
		}
	}
	a += "  shed/s " + rateText(iv.rate("overload.shed_total"), false)
	return []string{"OVERLOAD", p, a}
}
