package stats

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hotproxy/hotproxy/shm"
)

// TopSort is the order of the listener and cluster rows of a Top frame.
type TopSort int

// Sort orders of Top, in the order the 's' key cycles through them.
const (
	SortByName    TopSort = iota // by name
	SortByRate                   // by requests per second, highest first
	SortByLatency                // by the interval's p99, highest first
	numTopSorts
)

func (s TopSort) String() string {
	switch s {
	case SortByName:
		return "name"
	case SortByRate:
		return "req/s"
	case SortByLatency:
		return "p99"
	}
	return "sort(" + strconv.Itoa(int(s)) + ")"
}

// Next is the sort order after s, for a key that cycles through them.
func (s TopSort) Next() TopSort { return (s + 1) % numTopSorts }

// Top is the model behind `hotproxy top`: it takes successive snapshots of
// one region and renders full-screen frames of per-listener and
// per-cluster rows with rates and the latency quantiles of the last
// interval, the generations attached, and a sparkline of each listener's
// request rate. It reads only snapshots, so it works while the proxy is
// wedged. The zero value sorts by name with no filter. Not safe for
// concurrent use.
type Top struct {
	// Sort orders the rows.
	Sort TopSort
	// Filter keeps only the listeners and clusters whose name matches.
	Filter *regexp.Regexp
	// Keys is the second line: the key help, e.g. "q quit  s sort  /
	// filter", or a prompt or message; empty for a blank line.
	Keys string

	prev   *shm.Snapshot
	prevAt time.Time
	cur    *shm.Snapshot
	curAt  time.Time
	// history holds each listener's last request rates, oldest first, for
	// its sparkline; at most topHistory of them.
	history map[string][]float64
}

// topHistory is how many intervals a sparkline remembers.
const topHistory = 120

// Update takes snap, taken at at, as the newest snapshot: the next frame's
// rates and quantiles are over the time since the previous one.
func (t *Top) Update(snap *shm.Snapshot, at time.Time) {
	t.prev, t.prevAt = t.cur, t.curAt
	t.cur, t.curAt = snap, at
	if t.history == nil {
		t.history = map[string][]float64{}
	}
	if t.prev == nil {
		return
	}
	seen := map[string]bool{}
	for _, l := range t.listeners() {
		seen[l.name] = true
		h := append(t.history[l.name], max(l.rate, 0))
		if len(h) > topHistory {
			h = h[len(h)-topHistory:]
		}
		t.history[l.name] = h
	}
	for name := range t.history {
		if !seen[name] {
			delete(t.history, name)
		}
	}
}

// interval gives the rate of a counter and the interval quantiles of a
// histogram between the previous and the current snapshot.
type interval struct {
	prev, cur map[string]shm.Stat
	dt        time.Duration
	first     bool // no previous snapshot
}

func (iv interval) rate(name string) float64 {
	if iv.first {
		return math.NaN()
	}
	c, ok := iv.cur[name]
	if !ok {
		return math.NaN()
	}
	p, seen := iv.prev[name]
	if seen && p.Kind != c.Kind {
		return math.NaN()
	}
	r, ok := counterRate(countOf(p), countOf(c), iv.dt)
	if !ok {
		return math.NaN()
	}
	return r
}

func (iv interval) gauge(name string) int64 { return iv.cur[name].Gauge }

func (iv interval) quantiles(name string) (p50, p90, p99 float64) {
	nan := math.NaN()
	c, ok := iv.cur[name]
	if iv.first || !ok || c.Kind != shm.KindHistogram {
		return nan, nan, nan
	}
	var prevH *shm.HistogramValue
	if p, seen := iv.prev[name]; seen && p.Kind == shm.KindHistogram {
		prevH = p.Histogram
	}
	d, ok := HistogramDelta(prevH, c.Histogram)
	if !ok || d.Count == 0 {
		return nan, nan, nan
	}
	return Quantile(d.Buckets, 0.5), Quantile(d.Buckets, 0.9), Quantile(d.Buckets, 0.99)
}

func (t *Top) interval() interval {
	iv := interval{cur: statsByName(t.cur), first: t.prev == nil}
	if t.prev != nil {
		iv.prev, iv.dt = statsByName(t.prev), t.curAt.Sub(t.prevAt)
	}
	return iv
}

// Frame is the text of one screen: at most rows lines, none longer than
// cols characters (columns that do not fit are cut), without escape codes.
// Sections, each a title line then a header line then its rows:
//
//	hotproxy top  <time>  interval <d>  sort <s>  [filter /re/]  <path>
//	<keys, or a blank line>
//	GENERATIONS
//	SLOT  EPOCH  PID  STATE  AGE  HEARTBEAT
//	LISTENERS
//	NAME  REQ/S  5XX/S  CONN  RX/S  TX/S  P50  P90  P99  REQ/S TREND
//	CLUSTERS
//	NAME  REQ/S  FAIL/S  CONN  HEALTHY  P50  P90  P99
//	OVERLOAD (only where a generation runs the overload manager)
//	PRESSURE  heap 41%  ...
//	ACTIONS   stop_accepting ON  ...  shed/s 120
//
// with a blank line between sections (the second line is the first). Rates and quantiles are "-" until
// there are two snapshots, and quantiles "-" for an interval without a
// sample: they are of the last interval alone, never since start.
func (t *Top) Frame(rows, cols int) []string {
	var lines []string
	add := func(s string) { lines = append(lines, s) }
	// The path goes last on the top line, so a narrow screen cuts it and
	// keeps the time, interval and sort.
	head := "hotproxy top"
	if t.cur != nil {
		head += "  " + t.curAt.Format("15:04:05")
		if t.prev != nil {
			head += "  interval " + t.curAt.Sub(t.prevAt).Round(time.Millisecond).String()
		}
	}
	head += "  sort " + t.Sort.String()
	if t.Filter != nil {
		head += "  filter /" + t.Filter.String() + "/"
	}
	if t.cur != nil {
		head += "  " + t.cur.Path
	}
	add(head)
	add(t.Keys)
	if t.cur == nil {
		add("(no snapshot yet)")
		return clip(lines, rows, cols)
	}

	add("GENERATIONS")
	gens := [][]string{{"SLOT", "EPOCH", "PID", "STATE", "AGE", "HEARTBEAT"}}
	owners := append([]shm.Owner(nil), t.cur.Owners...)
	sort.Slice(owners, func(i, j int) bool { return owners[i].Epoch > owners[j].Epoch })
	states := generationStates(owners, statsByName(t.cur))
	for i, ow := range owners {
		age := "-"
		if ow.Start.UnixNano() > 0 {
			age = t.curAt.Sub(ow.Start).Round(time.Second).String()
		}
		gens = append(gens, []string{strconv.Itoa(ow.Slot), strconv.FormatUint(ow.Epoch, 10), strconv.Itoa(ow.PID),
			states[i], age, heartbeatAge(ow.Heartbeat, t.curAt)})
	}
	lines = append(lines, table(gens, "lrrlrr")...)
	if len(owners) == 0 {
		add("(none attached: no generation is running; the values are what the last ones left)")
	}
	if line := watchdogLine(statsByName(t.cur)); line != "" {
		add(line)
	}

	add("")
	add("LISTENERS")
	ls := t.listeners()
	lt := [][]string{{"NAME", "REQ/S", "5XX/S", "CONN", "RX/S", "TX/S", "P50", "P90", "P99"}}
	for _, r := range ls {
		lt = append(lt, []string{r.name, rateText(r.rate, false), rateText(r.errRate, false), strconv.FormatInt(r.active, 10),
			rateText(r.rx, true), rateText(r.tx, true), FormatMillis(r.p50), FormatMillis(r.p90), FormatMillis(r.p99)})
	}
	lt0 := table(lt, "lrrrrrrrr")
	// The sparkline fills what is left of the line.
	for i, l := range lt0 {
		spark := cols - utf8.RuneCountInString(l) - 2
		if i == 0 {
			if spark >= len("REQ/S TREND") {
				l += "  REQ/S TREND"
			}
		} else if spark > 0 {
			l += "  " + Sparkline(t.history[ls[i-1].name], spark)
		}
		lt0[i] = l
	}
	lines = append(lines, lt0...)
	if len(ls) == 0 {
		add("(none)")
	}

	add("")
	add("CLUSTERS")
	cs := t.clusters()
	ct := [][]string{{"NAME", "REQ/S", "FAIL/S", "CONN", "HEALTHY", "P50", "P90", "P99"}}
	for _, r := range cs {
		ct = append(ct, []string{r.name, rateText(r.rate, false), rateText(r.errRate, false), strconv.FormatInt(r.active, 10),
			fmt.Sprintf("%d/%d", r.healthy, r.size), FormatMillis(r.p50), FormatMillis(r.p90), FormatMillis(r.p99)})
	}
	lines = append(lines, table(ct, "lrrrrrrr")...)
	if len(cs) == 0 {
		add("(none)")
	}
	if ol := t.overloadLines(); ol != nil {
		add("")
		lines = append(lines, ol...)
	}
	return clip(lines, rows, cols)
}

// generationStates is the STATE of each owner (sorted newest first): the
// newest live one's lifecycle state from the server.state gauge (a
// "newest" gauge, so it is that generation's: serving, draining or
// starting), "draining" for an older live one (one generation serves; the
// ones it took over from drain), and the owner state otherwise (folding:
// it exited or died and its counts are being folded). Without a
// server.state stat, a live owner is "live".
func generationStates(owners []shm.Owner, stats map[string]shm.Stat) []string {
	out := make([]string, len(owners))
	st, known := stats["server.state"]
	newest := true
	for i, ow := range owners {
		out[i] = ow.State.String()
		if ow.State != shm.OwnerLive || !known {
			continue
		}
		if !newest {
			out[i] = "draining"
			continue
		}
		newest = false
		switch st.Gauge {
		case 0:
			out[i] = "serving"
		case 1:
			out[i] = "draining"
		case 2:
			out[i] = "starting"
		}
	}
	return out
}

// Render writes the frame to a terminal in one Write: cursor home, each
// line followed by erase-to-end-of-line, then erase below. Redrawing in
// place (rather than clearing the screen first) does not flicker, over SSH
// too.
func (t *Top) Render(w io.Writer, rows, cols int) error {
	var b bytes.Buffer
	b.WriteString("\x1b[H")
	for i, l := range t.Frame(rows, cols) {
		if i > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString(l)
		b.WriteString("\x1b[K")
	}
	b.WriteString("\x1b[J")
	_, err := w.Write(b.Bytes())
	return err
}

// watchdogLine sums up the watchdog's stats (server/watchdog.go): stalls
// counted so far, and the loops whose heartbeat is older than a second
// now; "" when the region has none.
func watchdogLine(byName map[string]shm.Stat) string {
	miss, ok := byName["watchdog.miss"]
	if !ok {
		return ""
	}
	line := fmt.Sprintf("watchdog: %d misses, %d mega misses", miss.Counter, byName["watchdog.mega_miss"].Counter)
	var stale []string
	for name, st := range byName {
		if loop, ok := strings.CutSuffix(strings.TrimPrefix(name, "watchdog."), ".heartbeat_age_ms"); ok && st.Gauge >= 1000 {
			stale = append(stale, fmt.Sprintf("%s %s", loop, (time.Duration(st.Gauge)*time.Millisecond).String()))
		}
	}
	if len(stale) > 0 {
		sort.Strings(stale)
		line += "; stalled now: " + strings.Join(stale, ", ")
	}
	return line
}
