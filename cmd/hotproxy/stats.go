package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hotproxy/hotproxy/server/config"
	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// Output formats of `hotproxy stats`.
const (
	statsFormatText       = "text"
	statsFormatJSON       = "json"
	statsFormatPrometheus = "prometheus"
)

// statsTimeFormat is how `hotproxy stats` prints instants: RFC 3339 with
// milliseconds, in local time.
const statsTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// statsCmd runs `hotproxy stats`: it maps the shared-memory stats region
// read-only and prints it. It never talks to a proxy process and never
// writes to or locks the region, so it answers while the proxy is wedged.
func statsCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("stats [--base-id B | --path FILE | -c CONFIG] [--filter REGEX] [--usedonly]\n"+
		"                      [--format text|json|prometheus] [--owners] [--watch DURATION]",
		"Prints the stats of every generation of a hotproxy instance, read directly\n"+
			"from its shared-memory region. It never touches the running proxy: no\n"+
			"request to the admin API, no signal, and the region is mapped read-only,\n"+
			"never written and never locked. So it answers even when the proxy is\n"+
			"wedged, and it cannot disturb it.\n\n"+
			"The region file is --path if given; otherwise the [stats] path of the\n"+
			"config given with -c, if it sets one; otherwise\n"+
			"/dev/shm/hotproxy.<base-id>.stats.\n\n"+
			"Exit status: 0 printed; 1 the region cannot be read (missing, truncated,\n"+
			"foreign, another layout version); 2 a bad command line.", stderr)
	baseID := fs.Int("base-id", 0, "base `id` of the instance whose default region to read (/dev/shm/hotproxy.<id>.stats)")
	path := fs.String("path", "", "region `file` to read; wins over -c and --base-id")
	cfgPath := fs.String("c", "", "read the region named by this config `file`'s [stats] path (the default region of --base-id if it sets none)")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	filter := fs.String("filter", "", "only the stats whose name matches this `regex` (Go RE2 syntax, unanchored)")
	usedOnly := fs.Bool("usedonly", false, "skip stats whose value is zero (histograms with no samples)")
	format := fs.String("format", statsFormatText, "output `format`: text (name: value lines), json (with the owner table and histogram buckets), or prometheus (text exposition with # TYPE lines)")
	owners := fs.Bool("owners", false, "also print the owner table (slot, pid, epoch, state, start, heartbeat age, lanes) before the stats; in json it is always there, in prometheus it is written as comments")
	watch := fs.Duration("watch", 0, "re-read the region every `interval` (e.g. 1s) until interrupted, printing a timestamped block each time with the per-second rate of every counter over the last interval; text format only")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if *baseID < 0 {
		fmt.Fprintln(stderr, "hotproxy stats: --base-id must be 0 or more")
		return exitUsage
	}
	switch *format {
	case statsFormatText, statsFormatJSON, statsFormatPrometheus:
	default:
		fmt.Fprintf(stderr, "hotproxy stats: --format %q: want text, json or prometheus\n", *format)
		return exitUsage
	}
	if *watch < 0 {
		fmt.Fprintf(stderr, "hotproxy stats: --watch %v: must be greater than 0\n", *watch)
		return exitUsage
	}
	if *watch > 0 && *format != statsFormatText {
		fmt.Fprintf(stderr, "hotproxy stats: --watch prints the text table with rates; it does not combine with --format %s\n", *format)
		return exitUsage
	}
	opts := statsPrint{owners: *owners}
	opts.expose.UsedOnly = *usedOnly
	if *filter != "" {
		re, err := regexp.Compile(*filter)
		if err != nil {
			fmt.Fprintf(stderr, "hotproxy stats: --filter %q: %v\n", *filter, err)
			return exitUsage
		}
		opts.expose.Filter = re
	}

	src, err := resolveStatsRegion(*path, *cfgPath, *baseID)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	if *watch > 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := watchStats(ctx, stdout, stderr, src, *watch, opts); err != nil {
			fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
			return 1
		}
		return 0
	}
	snap, err := src.read()
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	if err := writeStats(stdout, snap, *format, opts, time.Now()); err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	return 0
}

// statsPrint is what to print of a snapshot.
type statsPrint struct {
	expose stats.ExposeOptions
	owners bool
}

// statsRegion is the region file to read and, for a missing file, the
// hint that says where it was expected to come from.
type statsRegion struct {
	path string
	hint string
}

// resolveStatsRegion picks the region file: path if set; else the config's
// [stats] path if it sets one; else the default region of baseID.
func resolveStatsRegion(path, cfgPath string, baseID int) (statsRegion, error) {
	if path != "" {
		return statsRegion{path: path, hint: "is hotproxy running with this [stats] path? check --path"}, nil
	}
	if cfgPath != "" {
		cfg, err := config.Load(cfgPath)
		if err != nil {
			return statsRegion{}, err
		}
		if cfg.Stats.Path != "" {
			return statsRegion{path: cfg.Stats.Path, hint: fmt.Sprintf("it is the [stats] path of %s: is hotproxy running with that config?", cfgPath)}, nil
		}
	}
	return statsRegion{
		path: shm.DefaultPath(uint64(baseID)),
		hint: fmt.Sprintf("is hotproxy running with base-id %d? use --base-id or --path", baseID),
	}, nil
}

// read maps the region read-only, takes one consistent snapshot and unmaps
// it. Each call opens the file afresh, so a region replaced in between
// (deleted and created again by a new generation) is seen.
func (s statsRegion) read() (*shm.Snapshot, error) {
	r, err := shm.OpenReader(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: no such file (%s)", s.path, s.hint)
	case errors.Is(err, os.ErrPermission):
		return nil, fmt.Errorf("%s: permission denied (the region is readable by the user, and with its file_mode the group, that runs hotproxy: run as one of them)", s.path)
	case err != nil:
		return nil, err
	}
	defer r.Close()
	return r.Snapshot()
}

// writeStats writes one snapshot in format; now is when it was taken (for
// heartbeat ages).
func writeStats(w io.Writer, snap *shm.Snapshot, format string, o statsPrint, now time.Time) error {
	switch format {
	case statsFormatJSON:
		return stats.WriteJSON(w, snap, o.expose)
	case statsFormatPrometheus:
		if o.owners {
			if err := writeOwnerComments(w, snap.Owners, now); err != nil {
				return err
			}
		}
		return stats.WritePrometheus(w, snap, o.expose)
	}
	if o.owners {
		if err := writeOwners(w, snap.Owners, now); err != nil {
			return err
		}
	}
	return stats.WriteText(w, snap, o.expose)
}

// writeOwners writes the owner table, one line per owner after a header,
// and a blank line.
func writeOwners(w io.Writer, owners []shm.Owner, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tPID\tEPOCH\tSTATE\tSTART\tHEARTBEAT\tLANES")
	for _, ow := range owners {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%d\n", ow.Slot, ow.PID, ow.Epoch, ow.State,
			formatInstant(ow.Start), heartbeatAge(ow.Heartbeat, now), ow.Lanes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(owners) == 0 {
		fmt.Fprintln(w, "(no owners: no generation is attached to this region)")
	}
	_, err := fmt.Fprintln(w)
	return err
}

// writeOwnerComments writes the owner table as Prometheus comment lines,
// which scrapers ignore.
func writeOwnerComments(w io.Writer, owners []shm.Owner, now time.Time) error {
	for _, ow := range owners {
		_, err := fmt.Fprintf(w, "# hotproxy owner slot=%d pid=%d epoch=%d state=%s start=%s heartbeat_age=%s lanes=%d\n",
			ow.Slot, ow.PID, ow.Epoch, ow.State, formatInstant(ow.Start), heartbeatAge(ow.Heartbeat, now), ow.Lanes)
		if err != nil {
			return err
		}
	}
	return nil
}

func formatInstant(t time.Time) string {
	if t.UnixNano() <= 0 {
		return "-"
	}
	return t.Format(statsTimeFormat)
}

// heartbeatAge is how long ago the owner's last heartbeat was, "-" if it
// never beat.
func heartbeatAge(hb, now time.Time) string {
	if hb.UnixNano() <= 0 {
		return "-"
	}
	age := now.Sub(hb)
	if age < 0 {
		age = 0
	}
	return age.Round(time.Millisecond).String() + " ago"
}

// watchPoint is one snapshot of --watch and when it was taken.
type watchPoint struct {
	at   time.Time
	snap *shm.Snapshot
}

// watchStats prints a block every interval until ctx is done. A first read
// that fails is returned; later failures (a region being replaced, an
// allocation in progress for too long) are reported on stderr and the
// next interval tries again.
func watchStats(ctx context.Context, stdout, stderr io.Writer, src statsRegion, interval time.Duration, o statsPrint) error {
	snap, err := src.read()
	if err != nil {
		return err
	}
	cur := &watchPoint{at: time.Now(), snap: snap}
	if err := writeWatchBlock(stdout, cur, nil, o); err != nil {
		return err
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		snap, err := src.read()
		if err != nil {
			fmt.Fprintf(stderr, "hotproxy stats: %s: %v (retrying every %v)\n", time.Now().Format(statsTimeFormat), err, interval)
			continue
		}
		next := &watchPoint{at: time.Now(), snap: snap}
		if err := writeWatchBlock(stdout, next, cur, o); err != nil {
			return err
		}
		cur = next
	}
}

// writeWatchBlock writes one --watch block: a header line with the time
// and the interval, the owner table if asked, then every selected stat as
// WriteText writes it; counters (and histogram counts) are followed by
// their per-second rate since prev. prev nil is the first block: no rates.
func writeWatchBlock(w io.Writer, cur, prev *watchPoint, o statsPrint) error {
	var b bytes.Buffer
	var dt time.Duration
	if prev != nil {
		dt = cur.at.Sub(prev.at)
		fmt.Fprintf(&b, "--- %s %s (rates over the last %v) ---\n", cur.at.Format(statsTimeFormat), cur.snap.Path, dt.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "--- %s %s ---\n", cur.at.Format(statsTimeFormat), cur.snap.Path)
	}
	if o.owners {
		if err := writeOwners(&b, cur.snap.Owners, cur.at); err != nil {
			return err
		}
	}
	var before map[string]shm.Stat
	if prev != nil {
		before = make(map[string]shm.Stat, len(prev.snap.Stats))
		for _, st := range prev.snap.Stats {
			before[st.Name] = st
		}
	}
	one := &shm.Snapshot{Stats: make([]shm.Stat, 1)}
	for _, st := range selectStats(cur.snap, o.expose) {
		// The exposition's own line for this one stat, so the watch
		// table reads exactly like `hotproxy stats`.
		one.Stats[0] = st
		var line bytes.Buffer
		if err := stats.WriteText(&line, one, stats.ExposeOptions{}); err != nil {
			return err
		}
		b.WriteString(strings.TrimSuffix(line.String(), "\n"))
		if prev != nil && st.Kind != shm.KindGauge {
			// A stat created during the interval counted from 0 (p is
			// the zero Stat); one that changed kind is of a region
			// created again.
			p, seen := before[st.Name]
			if r, ok := counterRate(countOf(p), countOf(st), dt); ok && (!seen || p.Kind == st.Kind) {
				fmt.Fprintf(&b, " (+%.1f/s)", r)
			} else {
				b.WriteString(" (reset)")
			}
		}
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// countOf is what a rate is taken of: a counter's value, a histogram's
// sample count.
func countOf(st shm.Stat) uint64 {
	switch st.Kind {
	case shm.KindCounter:
		return st.Counter
	case shm.KindHistogram:
		if st.Histogram != nil {
			return st.Histogram.Count
		}
	}
	return 0
}

// counterRate is the per-second increase of a counter that went from prev
// to cur over dt. ok is false when there is no rate to give: dt is not
// positive, or the counter went down, which a counter of one region never
// does (the region was deleted and created again).
func counterRate(prev, cur uint64, dt time.Duration) (perSecond float64, ok bool) {
	if dt <= 0 || cur < prev {
		return 0, false
	}
	return float64(cur-prev) / dt.Seconds(), true
}

// selectStats is the stats o selects, sorted by name, as the exposition
// functions select them.
func selectStats(snap *shm.Snapshot, o stats.ExposeOptions) []shm.Stat {
	out := make([]shm.Stat, 0, len(snap.Stats))
	for _, st := range snap.Stats {
		if o.Filter != nil && !o.Filter.MatchString(st.Name) {
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
