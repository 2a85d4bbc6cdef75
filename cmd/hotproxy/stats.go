package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/stats"
)

// Output formats of `hotproxy stats`.
const (
	statsFormatText       = "text"
	statsFormatJSON       = "json"
	statsFormatPrometheus = "prometheus"
	statsFormatNDJSON     = "ndjson"
	statsFormatVMRange    = "vmrange"
)

// statsCmd runs `hotproxy stats`: it maps the shared-memory stats region
// read-only and prints it. It never talks to a proxy process and never
// writes to or locks the region, so it answers while the proxy is wedged.
func statsCmd(args []string, stdout, stderr io.Writer) int {
	args = watchArgs(args)
	fs := newFlags("stats [--base-id B | --path FILE | -c CONFIG] [--filter REGEX] [--usedonly]\n"+
		"                      [--format text|json|prometheus|vmrange|ndjson] [--owners] [--watch [DURATION]]\n"+
		"       hotproxy stats --prune [--dir DIR | --path FILE | --base-id B]",
		"Prints the stats of every generation of a hotproxy instance, read directly\n"+
			"from its shared-memory region. It never touches the running proxy: no\n"+
			"request to the admin API, no signal, and the region is mapped read-only,\n"+
			"never written and never locked. So it answers even when the proxy is\n"+
			"wedged, and it cannot disturb it.\n\n"+
			"The region file is --path if given; otherwise the [stats] path of the\n"+
			"config given with -c, if it sets one; otherwise, with -c and no\n"+
			"--base-id (nor $HOTPROXY_BASE_ID), the region of the live instance that\n"+
			"runs that config (its generations' command lines name it; none or\n"+
			"several is an error); otherwise /dev/shm/hotproxy.<base-id>.stats.\n\n"+
			"With --expect NAME=VALUE it prints nothing and exits 0 only if the stat\n"+
			"has that value (as the text format prints it): a health check, e.g.\n"+
			"--expect server.live=1, that needs no shell.\n\n"+
			"Exit status: 0 printed (or the expectation holds); 1 the region cannot be\n"+
			"read (missing, truncated, foreign, another layout version), or the\n"+
			"expectation does not hold; 2 a bad command line.", stderr)
	baseID := fs.Int("base-id", defaultBaseID(), "base `id` of the instance whose default region to read (/dev/shm/hotproxy.<id>.stats); default $HOTPROXY_BASE_ID if set, else 0")
	path := fs.String("path", "", "region `file` to read; wins over -c and --base-id")
	cfgPath := fs.String("c", "", "read the region of this config `file`: its [stats] path, else that of the live instance that runs it (or of --base-id if given)")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	filter := fs.String("filter", "", "only the stats whose name matches this `regex` (Go RE2 syntax, unanchored)")
	usedOnly := fs.Bool("usedonly", false, "skip stats whose value is zero (histograms with no samples)")
	format := fs.String("format", statsFormatText, "output `format`: text (name: value lines), json (with the owner table and histogram buckets), prometheus (the Prometheus text format: hotproxy_ names, listener and cluster as labels, seconds, classic le histograms, # HELP and # TYPE, the generations as hotproxy_generation_alive{slot,pid,epoch}), vmrange (the same with VictoriaMetrics vmrange histogram buckets), or ndjson (with --watch: one JSON object per line and interval, with rates and the interval's quantiles)")
	owners := fs.Bool("owners", false, "print the owner table (slot, pid, epoch, state: live, or dead when its process is gone, start, heartbeat age, lanes); alone, only the table; with --filter, --usedonly, --all or --retired, the table then those stats; in json it is always there, in prometheus it is written as comments")
	watch := fs.Duration("watch", 0, "re-read the region every `interval` (--watch alone: 1s) until interrupted; text: a timestamped block of aligned columns with each counter's rate and each histogram's quantiles over the last interval; ndjson: a line per interval")
	all := fs.Bool("all", false, "also the retired stats: of listeners and clusters that no live generation has any more (an older config's), marked (retired); hidden by default")
	retiredOnly := fs.Bool("retired", false, "only the retired stats (see --all): what older configs' listeners and clusters counted")
	prune := fs.Bool("prune", false, "remove the regions that no process uses, instead of printing stats: every /dev/shm/hotproxy.<id>.stats (or in --dir), or only the one of --path or --base-id; a region a live generation holds (its owner lock) is never removed, nor a file that is not a region")
	expect := fs.String("expect", "", "`NAME=VALUE`: print nothing, exit 0 if the stat NAME reads VALUE and 1 (saying what it read) if not; e.g. server.live=1 for a health check")
	pruneDir := fs.String("dir", "", "with --prune: the `directory` whose hotproxy.<id>.stats files to prune (default /dev/shm)")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if *baseID < 0 {
		fmt.Fprintln(stderr, "hotproxy stats: --base-id must be 0 or more")
		return exitUsage
	}
	if *prune {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, f := range []string{"watch", "format", "filter", "usedonly", "owners", "all", "retired", "expect"} {
			if set[f] {
				fmt.Fprintf(stderr, "hotproxy stats: --prune removes unused regions and prints no stats; it does not combine with --%s\n", f)
				return exitUsage
			}
		}
		var paths []string
		switch {
		case set["path"] || set["base-id"] || set["c"] || set["config"]:
			src, err := resolveStatsRegion(*path, *cfgPath, *baseID, baseIDChosen(set["base-id"]))
			if err != nil {
				fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
				return 1
			}
			paths = []string{src.path}
		default:
			var err error
			if paths, err = shm.DefaultRegions(*pruneDir); err != nil {
				fmt.Fprintf(stderr, "hotproxy stats: --prune: %v\n", err)
				return 1
			}
		}
		return pruneRegions(stdout, stderr, paths)
	}
	if *pruneDir != "" {
		fmt.Fprintln(stderr, "hotproxy stats: --dir is the directory --prune scans; add --prune")
		return exitUsage
	}
	switch *format {
	case statsFormatText, statsFormatJSON, statsFormatPrometheus, statsFormatVMRange, statsFormatNDJSON:
	default:
		fmt.Fprintf(stderr, "hotproxy stats: --format %q: want text, json, prometheus, vmrange or ndjson\n", *format)
		return exitUsage
	}
	if *watch < 0 {
		fmt.Fprintf(stderr, "hotproxy stats: --watch %v: must be greater than 0\n", *watch)
		return exitUsage
	}
	if *watch > 0 && *format != statsFormatText && *format != statsFormatNDJSON {
		fmt.Fprintf(stderr, "hotproxy stats: --watch prints text blocks or ndjson lines with rates; it does not combine with --format %s (use --format ndjson for JSON)\n", *format)
		return exitUsage
	}
	if *format == statsFormatNDJSON && *watch == 0 {
		fmt.Fprintln(stderr, "hotproxy stats: --format ndjson is a line per interval: add --watch (e.g. --watch 1s); for one JSON document use --format json")
		return exitUsage
	}
	if *all && *retiredOnly {
		fmt.Fprintln(stderr, "hotproxy stats: --all and --retired: choose one (--all: every stat, --retired: the retired ones only)")
		return exitUsage
	}
	opts := statsPrint{owners: *owners}
	// --owners alone is a question about the generations: the table,
	// not every stat after it. A selection (--filter, --usedonly, --all,
	// --retired) asks for the stats too.
	opts.ownersOnly = *owners && *format == statsFormatText && *watch == 0 &&
		!flagSet(fs, "filter") && !*usedOnly && !*all && !*retiredOnly
	opts.expose.UsedOnly = *usedOnly
	switch {
	case *all:
		opts.expose.Retired = stats.ShowRetired
	case *retiredOnly:
		opts.expose.Retired = stats.OnlyRetired
	}
	if *filter != "" {
		re, err := regexp.Compile(*filter)
		if err != nil {
			fmt.Fprintf(stderr, "hotproxy stats: --filter %q: %v\n", *filter, err)
			return exitUsage
		}
		opts.expose.Filter = re
	}

	src, err := resolveStatsRegion(*path, *cfgPath, *baseID, baseIDChosen(flagSet(fs, "base-id")))
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy stats: %v\n", err)
		return 1
	}
	if *expect != "" {
		return expectStat(src, *expect, *watch > 0 || *format != statsFormatText || *filter != "", stderr)
	}
	if *watch > 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := watchStats(ctx, stdout, stderr, src, *watch, *format, opts); err != nil {
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
	if n := stats.CountRetired(snap); n > 0 && opts.expose.Retired == stats.HideRetired && *format == statsFormatText && !opts.ownersOnly {
		// On stderr, so the output stays name: value lines.
		fmt.Fprintf(stderr, "hotproxy stats: %d retired stats not shown (of listeners and clusters no live generation has): --all shows them too, --retired only them\n", n)
	}
	return 0
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// pruneRegions removes each region of paths that no process uses
// (shm.Prune), printing a line per file: "removed PATH" or "kept PATH
// (why)". It returns 1 if any could not be checked.
func pruneRegions(stdout, stderr io.Writer, paths []string) int {
	rc := 0
	if len(paths) == 0 {
		fmt.Fprintln(stdout, "no regions found")
	}
	for _, p := range paths {
		res, err := shm.Prune(p)
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "hotproxy stats: --prune: %v\n", err)
			rc = 1
		case res.Removed:
			fmt.Fprintf(stdout, "removed %s\n", p)
		default:
			fmt.Fprintf(stdout, "kept %s (%s)\n", p, res.Reason)
		}
	}
	return rc
}

// statsPrint is what to print of a snapshot.
type statsPrint struct {
	expose stats.ExposeOptions
	owners bool
	// ownersOnly: the owner table and nothing else (text --owners with
	// no selection of stats).
	ownersOnly bool
}

// statsRegion is the region file to read and, for a missing file, the
// hint that says where it was expected to come from.
type statsRegion struct {
	path string
	hint string
}

// resolveStatsRegion picks the region file: path if set; else the config's
// [stats] path if it sets one; else, for a config and no --base-id
// (baseIDSet false), the region of the live instance that runs that
// config (regionOfConfig: the base-id is on its command line only); else
// the default region of baseID.
func resolveStatsRegion(path, cfgPath string, baseID int, baseIDSet bool) (statsRegion, error) {
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
		if !baseIDSet {
			region, err := regionOfConfig(cfgPath)
			if err != nil {
				return statsRegion{}, err
			}
			return statsRegion{path: region, hint: fmt.Sprintf("it was the region of the instance that runs %s", cfgPath)}, nil
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

// writeStats writes one snapshot in format, with the owner table first if
// o asks for it; now is when it was taken (for heartbeat ages).
func writeStats(w io.Writer, snap *shm.Snapshot, format string, o statsPrint, now time.Time) error {
	switch format {
	case statsFormatJSON:
		return stats.WriteJSON(w, snap, o.expose)
	case statsFormatPrometheus, statsFormatVMRange:
		if o.owners {
			if err := stats.WriteOwnerComments(w, snap.Owners, now); err != nil {
				return err
			}
		}
		if format == statsFormatVMRange {
			return stats.WritePrometheusVMRange(w, snap, o.expose)
		}
		return stats.WritePrometheus(w, snap, o.expose)
	}
	if o.owners {
		if err := stats.WriteOwners(w, snap.Owners, now); err != nil {
			return err
		}
	}
	if o.ownersOnly {
		return nil
	}
	return stats.WriteText(w, snap, o.expose)
}

// watchArgs rewrites a bare --watch into --watch=1s, so that the flag
// has a default interval while "--watch 2s" keeps working: a --watch
// followed by a duration is joined with it, one followed by anything else
// (or nothing) gets the default.
func watchArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a != "--watch" && a != "-watch" {
			out = append(out, a)
			continue
		}
		if i+1 < len(args) {
			if _, err := time.ParseDuration(args[i+1]); err == nil {
				out = append(out, a+"="+args[i+1])
				i++
				continue
			}
		}
		out = append(out, a+"="+topDefaultInterval.String())
	}
	return out
}

// watchStats prints a block (stats.Watch), or an ndjson line, every
// interval until ctx is done. A first read that fails is returned; later failures (a region
// being replaced, an allocation in progress for too long) are reported on
// stderr and the next interval tries again.
func watchStats(ctx context.Context, stdout, stderr io.Writer, src statsRegion, interval time.Duration, format string, o statsPrint) error {
	watch := stats.Watch{Expose: o.expose, Owners: o.owners}
	nd := stats.NDJSON{Expose: o.expose}
	write := func(snap *shm.Snapshot, at time.Time) error {
		if format == statsFormatNDJSON {
			return nd.WriteLine(stdout, snap, at)
		}
		return watch.WriteBlock(stdout, snap, at)
	}
	snap, err := src.read()
	if err != nil {
		return err
	}
	if err := write(snap, time.Now()); err != nil {
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
			fmt.Fprintf(stderr, "hotproxy stats: %s: %v (retrying every %v)\n", time.Now().Format(stats.TimeFormat), err, interval)
			continue
		}
		if err := write(snap, time.Now()); err != nil {
			return err
		}
	}
}
