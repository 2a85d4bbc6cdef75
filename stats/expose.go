package stats

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

// ExposeOptions selects the stats to write. The zero value writes every
// stat that a live generation declares (not the retired ones).
type ExposeOptions struct {
	// Filter keeps only the stats whose name matches.
	Filter *regexp.Regexp
	// UsedOnly skips stats whose value is zero (a histogram with no
	// samples).
	UsedOnly bool
	// Retired says what to do with retired stats (shm.Stat.Retired: of a
	// listener or cluster no live generation has any more).
	Retired RetiredMode
}

// RetiredMode selects retired stats.
type RetiredMode int

// Retired modes of ExposeOptions.
const (
	// HideRetired leaves them out: the current config's stats only.
	HideRetired RetiredMode = iota
	// ShowRetired writes them too, marked: " (retired)" after a text
	// line, "retired": true in JSON.
	ShowRetired
	// OnlyRetired writes only them: the retired view.
	OnlyRetired
)

// CountRetired returns how many stats of snap are retired.
func CountRetired(snap *shm.Snapshot) int {
	n := 0
	for _, st := range snap.Stats {
		if st.Retired {
			n++
		}
	}
	return n
}

func (o ExposeOptions) selected(snap *shm.Snapshot) []shm.Stat {
	out := make([]shm.Stat, 0, len(snap.Stats))
	for _, st := range snap.Stats {
		if o.Filter != nil && !o.Filter.MatchString(st.Name) {
			continue
		}
		if (st.Retired && o.Retired == HideRetired) || (!st.Retired && o.Retired == OnlyRetired) {
			continue
		}
		if o.UsedOnly && st.Value() == 0 {
			continue
		}
		out = append(out, st)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FormatSum writes a histogram's sum for a person: at most three
// decimals (a microsecond for the *_time histograms, whose unit is the
// millisecond), trailing zeros dropped: 3077.007, not the float's
// 3077.0071629999943.
func FormatSum(v float64) string {
	s := strconv.FormatFloat(v, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// Quantiles written by WriteText for histograms.
var textQuantiles = []float64{0.5, 0.9, 0.99}

// WriteText writes "name: value" lines sorted by name. A histogram is
// written as "name: count=N sum=S p50=... p90=... p99=...". With
// ShowRetired, a retired stat's line ends in " (retired)".
func WriteText(w io.Writer, snap *shm.Snapshot, o ExposeOptions) error {
	bw := bufio.NewWriter(w)
	var line []byte
	for _, st := range o.selected(snap) {
		line = appendText(line[:0], st)
		if len(line) == 0 {
			continue // a kind this version does not know
		}
		if st.Retired && o.Retired == ShowRetired {
			line = append(line, " (retired)"...)
		}
		line = append(line, '\n')
		bw.Write(line)
	}
	return bw.Flush()
}

// appendText appends st's line of WriteText, without the newline, to b. It
// appends nothing for a kind it does not know.
func appendText(b []byte, st shm.Stat) []byte {
	switch st.Kind {
	case shm.KindCounter:
		b = fmt.Appendf(b, "%s: %d", st.Name, st.Counter)
	case shm.KindGauge:
		b = fmt.Appendf(b, "%s: %d", st.Name, st.Gauge)
	case shm.KindHistogram:
		h := st.Histogram
		b = fmt.Appendf(b, "%s: count=%d sum=%s", st.Name, h.Count, FormatSum(h.Sum))
		for _, q := range textQuantiles {
			b = fmt.Appendf(b, " p%s=%.4g", strconv.FormatFloat(q*100, 'f', -1, 64), Quantile(h.Buckets, q))
		}
	}
	return b
}

type jsonOwner struct {
	Slot      int       `json:"slot"`
	State     string    `json:"state"`
	PID       int       `json:"pid"`
	Epoch     uint64    `json:"epoch"`
	Start     time.Time `json:"start"`
	Heartbeat time.Time `json:"heartbeat"`
	Lanes     int       `json:"lanes"`
}

type jsonHistogram struct {
	Count     uint64             `json:"count"`
	Sum       float64            `json:"sum"`
	Quantiles map[string]float64 `json:"quantiles"`
	Buckets   map[string]uint64  `json:"buckets"` // vmrange -> count, non-zero only
}

type jsonStat struct {
	Name      string         `json:"name"`
	Kind      string         `json:"kind"`
	Mode      string         `json:"mode,omitempty"`
	Value     *int64         `json:"value,omitempty"`
	Counter   *uint64        `json:"counter,omitempty"`
	Histogram *jsonHistogram `json:"histogram,omitempty"`
	Retired   bool           `json:"retired,omitempty"`
}

// WriteJSON writes the snapshot as one JSON object:
// {"path","version","owners":[...],"stats":[{"name","kind",...}]}.
// Counters carry "counter" (uint64), gauges "value" (int64) and "mode",
// histograms "histogram" with count, sum, quantiles and non-zero vmrange
// buckets; a retired stat (if selected) "retired": true.
func WriteJSON(w io.Writer, snap *shm.Snapshot, o ExposeOptions) error {
	doc := struct {
		Path    string      `json:"path,omitempty"`
		Version string      `json:"version"`
		Owners  []jsonOwner `json:"owners"`
		Stats   []jsonStat  `json:"stats"`
	}{Path: snap.Path, Version: fmt.Sprintf("%d.%d", snap.Major, snap.Minor), Owners: []jsonOwner{}, Stats: []jsonStat{}}
	for _, ow := range snap.Owners {
		doc.Owners = append(doc.Owners, jsonOwner{ow.Slot, ow.State.String(), ow.PID, ow.Epoch, ow.Start, ow.Heartbeat, ow.Lanes})
	}
	for _, st := range o.selected(snap) {
		js := jsonStat{Name: st.Name, Kind: st.Kind.String(), Retired: st.Retired}
		switch st.Kind {
		case shm.KindCounter:
			v := st.Counter
			js.Counter = &v
		case shm.KindGauge:
			v := st.Gauge
			js.Value, js.Mode = &v, st.Mode.String()
		case shm.KindHistogram:
			h := st.Histogram
			jh := &jsonHistogram{Count: h.Count, Sum: h.Sum, Quantiles: map[string]float64{}, Buckets: map[string]uint64{}}
			for _, q := range textQuantiles {
				jh.Quantiles[strconv.FormatFloat(q, 'f', -1, 64)] = Quantile(h.Buckets, q)
			}
			for i, c := range h.Buckets {
				if c != 0 {
					jh.Buckets[VMRange(i)] = c
				}
			}
			js.Histogram = jh
		}
		doc.Stats = append(doc.Stats, js)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// SanitizeName turns a stat name into a Prometheus metric name: every
// character outside [a-zA-Z0-9_:] becomes '_', and a leading digit gets a
// '_' prefix. It never fails.
func SanitizeName(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 1)
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == ':':
		case c >= '0' && c <= '9':
			if i == 0 {
				b.WriteByte('_')
			}
		default:
			c = '_'
		}
		b.WriteByte(c)
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}
