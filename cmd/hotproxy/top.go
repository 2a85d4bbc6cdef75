package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/stats"
)

// topDefaultInterval is how often `hotproxy top` and `hotproxy stats
// --watch` re-read the region unless told otherwise.
const topDefaultInterval = time.Second

// topKeys is the key help on the top line.
const topKeys = "q quit  s sort  / filter  Esc clear"

// topCmd runs `hotproxy top`: a full-screen live view of a stats region.
// Like `hotproxy stats`, it only maps the region read-only, so it works
// while the proxy is wedged.
func topCmd(args []string, stdin *os.File, stdout io.Writer, stderr io.Writer) int {
	fs := newFlags("top [--base-id B | --path FILE | -c CONFIG] [--interval D] [--sort name|rate|p99] [--filter REGEX]",
		"A live, full-screen view of a hotproxy instance's stats, in the spirit of\n"+
			"varnishstat and htop: per listener and per cluster, requests per second,\n"+
			"errors, connections, bytes per second and the p50/p90/p99 latency of the\n"+
			"last interval (not since start), a sparkline of each listener's request\n"+
			"rate, and the generations attached with their epochs and states.\n\n"+
			"Like `hotproxy stats`, it reads the shared-memory region only (mapped\n"+
			"read-only, never locked): it works while the proxy is wedged, and over SSH\n"+
			"(plain ANSI escape codes, redrawn in place).\n\n"+
			"Keys: q (or Ctrl-C) quits; s cycles the sort order (name, req/s, p99); /\n"+
			"starts a filter (a regex on listener and cluster names; Enter applies it);\n"+
			"Esc clears it.\n\n"+
			"When stdout is not a terminal, frames are written as plain text, each\n"+
			"followed by a form feed line, with no escape codes (--frames bounds them).", stderr)
	baseID := fs.Int("base-id", defaultBaseID(), "base `id` of the instance whose default region to read (/dev/shm/hotproxy.<id>.stats); default $HOTPROXY_BASE_ID if set, else 0")
	path := fs.String("path", "", "region `file` to read; wins over -c and --base-id")
	cfgPath := fs.String("c", "", "read the region of this config `file`: its [stats] path, else that of the live instance that runs it (or of --base-id if given)")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	interval := fs.Duration("interval", topDefaultInterval, "redraw every `interval`; rates and quantiles are over it")
	sortBy := fs.String("sort", "name", "row `order`: name, rate or req/s (the header's word; highest first) or p99 (highest first)")
	filter := fs.String("filter", "", "only the listeners and clusters whose name matches this `regex`")
	frames := fs.Int("frames", 0, "draw this many frames, then exit (0: until q or Ctrl-C)")
	size := fs.String("size", "", "screen `COLSxROWS`, e.g. 120x40 (default: the terminal's, else $COLUMNS and $LINES, else 80x24)")
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if *baseID < 0 || *frames < 0 {
		fmt.Fprintln(stderr, "hotproxy top: --base-id and --frames must be 0 or more")
		return exitUsage
	}
	if *interval <= 0 {
		fmt.Fprintf(stderr, "hotproxy top: --interval %v: must be greater than 0 (e.g. 1s)\n", *interval)
		return exitUsage
	}
	top := &stats.Top{}
	switch *sortBy {
	case "name":
		top.Sort = stats.SortByName
	case "rate", stats.SortByRate.String(): // the header says "sort req/s"
		top.Sort = stats.SortByRate
	case "p99":
		top.Sort = stats.SortByLatency
	default:
		fmt.Fprintf(stderr, "hotproxy top: --sort %q: want name, rate (or req/s) or p99\n", *sortBy)
		return exitUsage
	}
	if *filter != "" {
		re, err := regexp.Compile(*filter)
		if err != nil {
			fmt.Fprintf(stderr, "hotproxy top: --filter %q: %v\n", *filter, err)
			return exitUsage
		}
		top.Filter = re
	}
	fixedCols, fixedRows := 0, 0
	if *size != "" {
		c, r, ok := parseSize(*size)
		if !ok {
			fmt.Fprintf(stderr, "hotproxy top: --size %q: want COLSxROWS with both at least 20x5, e.g. 120x40\n", *size)
			return exitUsage
		}
		fixedCols, fixedRows = c, r
	}
	src, err := resolveStatsRegion(*path, *cfgPath, *baseID, baseIDChosen(flagSet(fs, "base-id")))
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy top: %v\n", err)
		return 1
	}
	// Fail at once, before taking over the screen, when there is nothing
	// to show.
	snap, err := src.read()
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy top: %v\n", err)
		return 1
	}
	top.Update(snap, time.Now())

	outFile, _ := stdout.(*os.File)
	tty := outFile != nil && isTerminal(outFile)
	screenSize := func() (cols, rows int) {
		if fixedCols > 0 {
			return fixedCols, fixedRows
		}
		if tty {
			if c, r, err := terminalSize(outFile); err == nil && c > 0 && r > 0 {
				return c, r
			}
		}
		c, _ := strconv.Atoi(os.Getenv("COLUMNS"))
		r, _ := strconv.Atoi(os.Getenv("LINES"))
		if c <= 0 || r <= 0 {
			return 80, 24
		}
		return c, r
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keys := make(chan byte, 16)
	if tty && stdin != nil && isTerminal(stdin) {
		if restore, err := cbreak(stdin); err == nil {
			defer restore()
			top.Keys = topKeys
			go readKeys(stdin, keys)
		}
	}
	if tty {
		// The alternate screen keeps the shell's scrollback as it was;
		// the cursor is hidden while drawing.
		io.WriteString(stdout, "\x1b[?1049h\x1b[?25l")
		defer io.WriteString(stdout, "\x1b[?25h\x1b[?1049l")
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)

	draw := func() error {
		cols, rows := screenSize()
		if tty {
			return top.Render(stdout, rows, cols)
		}
		var b strings.Builder
		for _, l := range top.Frame(rows, cols) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		b.WriteString("\f\n")
		_, err := io.WriteString(stdout, b.String())
		return err
	}
	var lastErr string
	drawn := 0
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	var prompt *strings.Builder // the filter being typed; nil when not typing
	for {
		if err := draw(); err != nil {
			fmt.Fprintf(stderr, "hotproxy top: %v\n", err)
			return 1
		}
		drawn++
		if *frames > 0 && drawn >= *frames {
			return 0
		}
	wait:
		select {
		case <-ctx.Done():
			return 0
		case <-winch:
		case k := <-keys:
			if prompt != nil {
				switch k {
				case '\r', '\n':
					top.Keys = topKeys
					if prompt.Len() == 0 {
						top.Filter = nil
					} else if re, err := regexp.Compile(prompt.String()); err == nil {
						top.Filter = re
					} else {
						top.Keys = "bad regex: " + err.Error()
					}
					prompt = nil
				case 0x1b:
					prompt, top.Keys = nil, topKeys
				case 0x7f, 0x08:
					s := prompt.String()
					if len(s) > 0 {
						prompt.Reset()
						prompt.WriteString(s[:len(s)-1])
					}
					top.Keys = "filter: " + prompt.String() + "_"
				default:
					if k >= 0x20 {
						prompt.WriteByte(k)
					}
					top.Keys = "filter: " + prompt.String() + "_"
				}
				break wait
			}
			switch k {
			case 'q', 'Q':
				return 0
			case 's', 'S':
				top.Sort = top.Sort.Next()
			case '/':
				prompt = &strings.Builder{}
				top.Keys = "filter: _"
			case 0x1b:
				top.Filter = nil
			}
		case <-tick.C:
			snap, err := src.read()
			if err != nil {
				// Keep the last frame; say why it is not moving.
				if msg := err.Error(); msg != lastErr {
					lastErr = msg
					if !tty {
						fmt.Fprintf(stderr, "hotproxy top: %s: %v (retrying every %v)\n", time.Now().Format(stats.TimeFormat), err, *interval)
					}
				}
				if tty {
					top.Keys = "cannot read: " + err.Error()
				}
				continue
			}
			if lastErr != "" && tty {
				top.Keys = topKeys
			}
			lastErr = ""
			top.Update(snap, time.Now())
		}
	}
}

// readKeys sends each byte read from f to keys until f fails.
func readKeys(f *os.File, keys chan<- byte) {
	buf := make([]byte, 16)
	for {
		n, err := f.Read(buf)
		for _, b := range buf[:n] {
			keys <- b
		}
		if err != nil {
			return
		}
	}
}

// parseSize parses "COLSxROWS".
func parseSize(s string) (cols, rows int, ok bool) {
	c, r, found := strings.Cut(strings.ToLower(s), "x")
	if !found {
		return 0, 0, false
	}
	cols, err1 := strconv.Atoi(c)
	rows, err2 := strconv.Atoi(r)
	if err1 != nil || err2 != nil || cols < 20 || rows < 5 {
		return 0, 0, false
	}
	return cols, rows, true
}
