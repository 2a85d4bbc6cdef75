package stats

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

// HistogramDelta is what a histogram recorded between two snapshots of one
// region: the element-wise difference of its buckets, sum and count. ok is
// false when there is no difference to take: a bucket or the count went
// down, which a histogram of one region never does (the region was deleted
// and created again), or prev is of another layout. A nil prev is a
// histogram that did not exist yet: everything it holds is new.
//
// The quantiles of the result are those of the interval alone, not since
// the region was created: a latency spike shows in the interval it
// happened in, instead of being diluted by hours of history.
func HistogramDelta(prev, cur *shm.HistogramValue) (d shm.HistogramValue, ok bool) {
	if cur == nil {
		return shm.HistogramValue{}, false
	}
	if prev == nil {
		return shm.HistogramValue{Buckets: append([]uint64(nil), cur.Buckets...), Sum: cur.Sum, Count: cur.Count}, true
	}
	if len(prev.Buckets) != len(cur.Buckets) || cur.Count < prev.Count {
		return shm.HistogramValue{}, false
	}
	d.Buckets = make([]uint64, len(cur.Buckets))
	for i, c := range cur.Buckets {
		if c < prev.Buckets[i] {
			return shm.HistogramValue{}, false
		}
		d.Buckets[i] = c - prev.Buckets[i]
	}
	d.Sum, d.Count = cur.Sum-prev.Sum, cur.Count-prev.Count
	return d, true
}

// isBytes reports whether a stat counts bytes (by its name), so that it is
// shown in B, kB, MB rather than as a bare number.
func isBytes(name string) bool { return strings.Contains(name, "bytes") }

// FormatBytes writes n bytes for a person, in decimal units: "512 B",
// "1.5 kB", "12.3 MB", "1.02 GB".
func FormatBytes(n float64) string {
	const unit = 1000
	if math.Abs(n) < unit {
		return strconv.FormatFloat(n, 'f', 0, 64) + " B"
	}
	div, exp := float64(unit), 0
	for m := math.Abs(n) / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	v := n / div
	prec := 1
	if math.Abs(v) < 10 {
		prec = 2
	}
	return strconv.FormatFloat(v, 'f', prec, 64) + " " + string("kMGTPE"[exp]) + "B"
}

// FormatRate writes a per-second rate for a person: "56.0/s", "1.23k/s",
// "4.50M/s"; "1.20 MB/s" for bytes.
func FormatRate(perSecond float64, bytes bool) string {
	if bytes {
		return FormatBytes(perSecond) + "/s"
	}
	a := math.Abs(perSecond)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(perSecond/1e6, 'f', 2, 64) + "M/s"
	case a >= 1e4:
		return strconv.FormatFloat(perSecond/1e3, 'f', 1, 64) + "k/s"
	}
	return strconv.FormatFloat(perSecond, 'f', 1, 64) + "/s"
}

// FormatMillis writes a latency held in milliseconds (the unit of every
// *_time histogram): "850µs", "12.3ms", "1.25s"; "-" for NaN (no sample).
func FormatMillis(ms float64) string {
	switch {
	case math.IsNaN(ms):
		return "-"
	case ms < 1:
		return strconv.FormatFloat(ms*1000, 'f', 0, 64) + "µs"
	case ms < 100:
		return strconv.FormatFloat(ms, 'f', 1, 64) + "ms"
	case ms < 1000:
		return strconv.FormatFloat(ms, 'f', 0, 64) + "ms"
	}
	return strconv.FormatFloat(ms/1000, 'f', 2, 64) + "s"
}

// NDJSON writes successive snapshots of one region as newline-delimited
// JSON, one object per interval, for scripts: counters with their rate,
// histograms with their rate and the quantiles of the interval alone
// (HistogramDelta). It remembers the last snapshot, like Watch. Not safe
// for concurrent use.
type NDJSON struct {
	// Expose selects the stats of each line.
	Expose ExposeOptions

	prev   *shm.Snapshot
	prevAt time.Time
}

// ndjsonInterval is a histogram's interval part.
type ndjsonInterval struct {
	Count     uint64             `json:"count"`
	Sum       float64            `json:"sum"`
	Quantiles map[string]float64 `json:"quantiles"`
}

type ndjsonHistogram struct {
	Count     uint64             `json:"count"`
	Sum       float64            `json:"sum"`
	Quantiles map[string]float64 `json:"quantiles"` // since the region was created
	Rate      *float64           `json:"rate,omitempty"`
	Interval  *ndjsonInterval    `json:"interval,omitempty"`
}

type ndjsonStat struct {
	Name      string           `json:"name"`
	Kind      string           `json:"kind"`
	Mode      string           `json:"mode,omitempty"`
	Value     *int64           `json:"value,omitempty"`
	Counter   *uint64          `json:"counter,omitempty"`
	Rate      *float64         `json:"rate,omitempty"`
	Reset     bool             `json:"reset,omitempty"`
	Histogram *ndjsonHistogram `json:"histogram,omitempty"`
	Retired   bool             `json:"retired,omitempty"`
}

type ndjsonLine struct {
	Time     time.Time    `json:"time"`
	Path     string       `json:"path,omitempty"`
	Interval float64      `json:"interval_seconds"`
	Owners   []jsonOwner  `json:"owners"`
	Stats    []ndjsonStat `json:"stats"`
}

// WriteLine writes the line of snap, taken at at, with a single Write:
//
//	{"time","path","interval_seconds","owners":[...],"stats":[...]}
//
// interval_seconds is 0 on the first line, which has no rates and no
// interval quantiles. Later, a counter carries "rate" (per second), a
// histogram "rate" (samples per second) and "interval" (count, sum and the
// 0.5, 0.9, 0.99 quantiles of the samples of the interval alone; quantiles
// are 0 when it recorded none). A stat whose value went down or changed
// kind (the region was created again) carries "reset": true instead.
// Quantile keys are "0.5", "0.9", "0.99", as in WriteJSON.
func (n *NDJSON) WriteLine(w io.Writer, snap *shm.Snapshot, at time.Time) error {
	line := ndjsonLine{Time: at, Path: snap.Path, Owners: []jsonOwner{}, Stats: []ndjsonStat{}}
	var dt time.Duration
	var before map[string]shm.Stat
	if n.prev != nil {
		dt = at.Sub(n.prevAt)
		line.Interval = dt.Seconds()
		before = make(map[string]shm.Stat, len(n.prev.Stats))
		for _, st := range n.prev.Stats {
			before[st.Name] = st
		}
	}
	for _, ow := range snap.Owners {
		line.Owners = append(line.Owners, jsonOwner{ow.Slot, ow.State.String(), ow.PID, ow.Epoch, ow.Start, ow.Heartbeat, ow.Lanes})
	}
	for _, st := range n.Expose.selected(snap) {
		js := ndjsonStat{Name: st.Name, Kind: st.Kind.String(), Retired: st.Retired}
		p, seen := before[st.Name]
		sameKind := !seen || p.Kind == st.Kind
		switch st.Kind {
		case shm.KindCounter:
			v := st.Counter
			js.Counter = &v
			if n.prev != nil {
				if r, ok := counterRate(countOf(p), v, dt); ok && sameKind {
					js.Rate = &r
				} else {
					js.Reset = true
				}
			}
		case shm.KindGauge:
			v := st.Gauge
			js.Value, js.Mode = &v, st.Mode.String()
		case shm.KindHistogram:
			h := st.Histogram
			jh := &ndjsonHistogram{Count: h.Count, Sum: h.Sum, Quantiles: quantileMap(h.Buckets)}
			if n.prev != nil {
				var prevH *shm.HistogramValue
				if seen && sameKind {
					prevH = p.Histogram
				}
				d, ok := HistogramDelta(prevH, h)
				r, rok := counterRate(countOf(p), h.Count, dt)
				if ok && rok && sameKind {
					jh.Rate = &r
					jh.Interval = &ndjsonInterval{Count: d.Count, Sum: d.Sum, Quantiles: quantileMap(d.Buckets)}
				} else {
					js.Reset = true
				}
			}
			js.Histogram = jh
		default:
			continue
		}
		line.Stats = append(line.Stats, js)
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("stats: encoding an ndjson line: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return err
	}
	n.prev, n.prevAt = snap, at
	return nil
}

// quantileMap is the textQuantiles of buckets keyed as in WriteJSON.
func quantileMap(buckets []uint64) map[string]float64 {
	m := make(map[string]float64, len(textQuantiles))
	for _, q := range textQuantiles {
		m[strconv.FormatFloat(q, 'f', -1, 64)] = Quantile(buckets, q)
	}
	return m
}
