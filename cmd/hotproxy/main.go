// Command hotproxy is an L4/L7 proxy whose process can be replaced — new
// config or new binary — without a client noticing. This file parses flags
// and dispatches verbs; the work happens in the packages it calls.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/hotrestart"
	"github.com/hotproxy/hotproxy/internal/version"
	"github.com/hotproxy/hotproxy/server"
	"github.com/hotproxy/hotproxy/shm"
	"github.com/hotproxy/hotproxy/workers"
)

const usage = `hotproxy: an L4/L7 proxy that replaces itself without dropping a connection.

Usage:
  hotproxy serve    [-c FILE] [flags]   run one generation of the proxy
  hotproxy supervise [-c FILE] [flags]  run the generations: reloads, systemd notify, PID 1
  hotproxy reload   [--supervisor]      start the next generation (or re-execute the supervisor)
  hotproxy status   [--json]            the supervisor's generations
  hotproxy stats    [flags]             the stats, read from shared memory (never asks the proxy)
  hotproxy top      [flags]             a live full-screen view of the stats: rates, latency, generations
  hotproxy validate [-c] FILE           build a config fully, without binding anything
  hotproxy version | --version          build and protocol versions
  hotproxy help [VERB] | -h | --help    this text, or a verb's flags

With no -c, serve, supervise and validate use the embedded default config:
an HTTP listener on 127.0.0.1:10000 that answers directly, and the admin API
on 127.0.0.1:9901.

HOTPROXY_BASE_ID, when set, is every verb's default --base-id (set it once on
a container: docker exec and the image's health check inherit it).
`

// exitUsage is the exit status for a command line that cannot be run.
const exitUsage = 2

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "serve":
		return serve(rest, stderr)
	case "supervise":
		return superviseCmd(rest, stderr)
	case "reload":
		return reloadCmd(rest, stdout, stderr)
	case "status":
		return statusCmd(rest, stdout, stderr)
	case "stats":
		return statsCmd(rest, stdout, stderr)
	case "top":
		return topCmd(rest, os.Stdin, stdout, stderr)
	case "validate":
		return validate(rest, stdout, stderr)
	case "version", "--version", "-version", "-V":
		return printVersion(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			return run([]string{rest[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "hotproxy: unknown verb %q (run 'hotproxy help' for the list)\n", verb)
	return exitUsage
}

// newFlags makes a verb's flag set; its --help prints the verb's usage line
// and its flags.
func newFlags(verb, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: hotproxy %s\n\n%s\n\nFlags:\n", verb, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// verbOf is the verb of a flag set made by newFlags, whose name is the
// verb's usage line.
func verbOf(fs *flag.FlagSet) string {
	verb, _, _ := strings.Cut(fs.Name(), " ")
	return verb
}

// parse parses args; it returns -1 to go on, or the exit status. -h and
// --help print the verb's whole usage; a mistake prints one line that says
// what is wrong and where the flags are described, not the whole usage,
// which would bury the line that matters.
// envBaseID is the default of every verb's --base-id: set once on a
// container (`docker run -e HOTPROXY_BASE_ID=3`), it reaches the
// supervisor, `docker exec ... hotproxy status|reload|stats` and the
// image's HEALTHCHECK alike, which an argument to the entrypoint does not.
const envBaseID = "HOTPROXY_BASE_ID"

// defaultBaseID is $HOTPROXY_BASE_ID, or 0 when it is unset or empty (or not a
// base-id: parse refuses that with a message).
func defaultBaseID() int {
	id, _ := parseBaseID(os.Getenv(envBaseID))
	return id
}

// baseIDChosen: --base-id was given (given), or $HOTPROXY_BASE_ID names
// one; either way the user chose the instance, and nothing is searched.
func baseIDChosen(given bool) bool {
	_, env := parseBaseID(os.Getenv(envBaseID))
	return given || env
}

func parseBaseID(s string) (int, bool) {
	id, err := strconv.Atoi(s)
	return id, err == nil && id >= 0
}

func parse(fs *flag.FlagSet, args []string) int {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	verb := verbOf(fs)
	if v := os.Getenv(envBaseID); v != "" && fs.Lookup("base-id") != nil {
		if _, ok := parseBaseID(v); !ok {
			fmt.Fprintf(out, "hotproxy %s: %s=%q: want a whole number, 0 or more (the default of --base-id)\n", verb, envBaseID, v)
			return exitUsage
		}
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		return 0
	case err != nil:
		fmt.Fprintf(out, "hotproxy %s: %v (run 'hotproxy help %s' for its flags)\n", verb, err, verb)
		return exitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(out, "hotproxy %s: unexpected argument %q (run 'hotproxy help %s' for its usage)\n", verb, fs.Arg(0), verb)
		return exitUsage
	}
	return -1
}

func serve(args []string, stderr io.Writer) int {
	fs := newFlags("serve [-c FILE] [flags]",
		"Runs one generation of the proxy until SIGTERM or SIGINT, then drains it\n"+
			"(stops accepting, finishes requests in flight) within server.drain_time.\n\n"+
			"Hot restart: a generation started with --restart-epoch N takes over the\n"+
			"listening sockets of the running generation of epoch N-1 (same --base-id),\n"+
			"serves, and then tells it to drain; that one exits by itself. If the new\n"+
			"generation dies within hot_restart.commit_window, the old one serves again.\n\n"+
			"A generation that `hotproxy supervise` started hands over only to generations\n"+
			"a supervisor started: under a supervisor, reload with `hotproxy reload` or\n"+
			"SIGHUP to the supervisor, never with --restart-epoch by hand (refused).\n\n"+
			"TLS: certificate and key files are watched, and re-read on SIGUSR2 (or POST\n"+
			"/tls/reload on the admin API); a pair that does not load is refused and the\n"+
			"old one serves on. Session-ticket keys pass to the next generation, so TLS\n"+
			"sessions resume across a hot restart.", stderr)
	cfgPath := fs.String("c", "", "config `file` (TOML); empty: the embedded default")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	logLevel := fs.String("log-level", "", "log `level`: trace, debug, info, warn, error (overrides [log] level)")
	logFormat := fs.String("log-format", "", "log `format`: text or json (overrides [log] format)")
	baseID := fs.Int("base-id", defaultBaseID(), "`id` of this hotproxy instance: tells apart the restart sockets and stats regions (default /dev/shm/hotproxy.<id>.stats, see [stats] path) of instances on one machine; default $HOTPROXY_BASE_ID if set, else 0")
	epoch := fs.Int("restart-epoch", 0, "hot-restart `epoch`: 0 starts cold; N > 0 takes over from the running generation of epoch N-1")
	allowCold := fs.Bool("allow-cold-start", false, "with --restart-epoch N > 0: start cold when no generation of epoch N-1 is running")
	restartParent := fs.String("restart-parent", "", "with --restart-epoch N > 0: the generation to take over from, `PID[:START]` (START: its start time, /proc/PID/stat field 22), "+
		"or \"none\" to start cold without dialing; a listener on the restart socket that is not it is skipped, unspoken to; "+
		"or \"kept\": the previous generation died or wedged, take the listening sockets the supervisor kept of it (needs --supervisor-fd). "+
		"The supervisor sets it; default: any generation of this user or root")
	supervisorFD := fs.Int("supervisor-fd", -1, "file `descriptor` of the link to the supervisor, which keeps a copy of this generation's listening sockets "+
		"for its successor should it die (the supervisor sets it)")
	readyFD := fs.Int("ready-fd", -1, "file `descriptor` to write \"READY <pid>\" to once serving (or \"FAILED <reason>\" on a failed start), then close")
	// A fault-injection hook for the integration tests, kept out of the
	// flag set so that --help never offers it.
	stopAfterTakeover, args := takeHiddenFlag(args, testStopAfterTakeoverFlag)
	blockMainAfter, args, err := takeHiddenDuration(args, testBlockMainAfterFlag)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		return exitUsage
	}
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if *baseID < 0 || *epoch < 0 {
		fmt.Fprintln(stderr, "hotproxy serve: --base-id and --restart-epoch must be 0 or more")
		return exitUsage
	}
	var parent hotrestart.ExpectedParent
	noParent := *restartParent == "none"
	takeKept := *restartParent == "kept"
	if takeKept && *supervisorFD < 0 {
		fmt.Fprintln(stderr, "hotproxy serve: --restart-parent kept needs --supervisor-fd (the kept sockets come over the supervisor's link)")
		return exitUsage
	}
	if *restartParent != "" && *epoch == 0 {
		fmt.Fprintln(stderr, "hotproxy serve: --restart-parent needs --restart-epoch N > 0 (epoch 0 takes over from nobody)")
		return exitUsage
	}
	if *restartParent != "" && !noParent && !takeKept {
		var err error
		if parent, err = hotrestart.ParseExpectedParent(*restartParent); err != nil {
			fmt.Fprintf(stderr, "hotproxy serve: --restart-parent: %v (or \"none\", or \"kept\")\n", err)
			return exitUsage
		}
	}
	ready := newReadyReporter(*readyFD)
	defer ready.close()

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		ready.failed(err)
		return 1
	}
	level, format := cfg.Log.Level, cfg.Log.Format
	if *logLevel != "" {
		level = *logLevel
	}
	if *logFormat != "" {
		format = *logFormat
	}
	logOut, logFile, err := openProcessLog(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		ready.failed(err)
		return 1
	}
	if logFile != nil {
		defer logFile.Close()
	}
	log, err := server.NewLogger(logOut, level, format)
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		return exitUsage
	}

	applyTimerSlack(log, cfg)
	if *epoch == 0 {
		warnColdStartBesideLive(log, cfg, *baseID)
	}
	srv, err := server.New(server.Options{
		Config:            cfg,
		Logger:            log,
		HandleSignals:     true,
		BaseID:            *baseID,
		Epoch:             *epoch,
		AllowColdStart:    *allowCold,
		Parent:            parent,
		NoParent:          noParent,
		SupervisorPID:     hotrestart.SupervisorFromEnv(),
		OnReady:           ready.ready,
		LogFile:           logFile,
		StopAfterTakeover: stopAfterTakeover,

		SupervisorLink:     supervisorLink(*supervisorFD),
		TakeKeptSockets:    takeKept,
		TestBlockMainAfter: blockMainAfter,
	})
	if err != nil {
		// Once as plain text for whoever started it; in the log too
		// only when the log is a file, not this same stderr.
		if logFile != nil {
			log.Error("cannot start", "error", err)
		}
		fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		ready.failed(err)
		return 1
	}
	if err := srv.Run(context.Background()); err != nil {
		log.Error("stopped with an error", "error", err)
		if logFile != nil {
			fmt.Fprintf(stderr, "hotproxy serve: %v\n", err)
		}
		return 1
	}
	return 0
}

// openProcessLog opens the file of [log] path, or returns stderr when it
// is not set (logFile is then nil).
func openProcessLog(cfg *config.Config, stderr io.Writer) (out io.Writer, logFile *server.LogFile, err error) {
	if cfg == nil || cfg.Log.Path == "" {
		return stderr, nil, nil
	}
	lf, err := server.OpenLogFile(cfg.Log.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", cfg.Source, err)
	}
	return lf, lf, nil
}

// testStopAfterTakeoverFlag is serve's hidden test hook (see
// server.Options.StopAfterTakeover).
const testStopAfterTakeoverFlag = "--test-stop-after-takeover"

// testBlockMainAfterFlag is serve's hidden test hook of the watchdog (see
// server.Options.TestBlockMainAfter): "--test-block-main-after=DURATION".
const testBlockMainAfterFlag = "--test-block-main-after"

// takeHiddenDuration removes "flag=DURATION" from args and returns the
// duration (0 when absent).
func takeHiddenDuration(args []string, flag string) (time.Duration, []string, error) {
	var d time.Duration
	rest := make([]string, 0, len(args))
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			var err error
			if d, err = time.ParseDuration(v); err != nil || d <= 0 {
				return 0, nil, fmt.Errorf("%s: %q is not a duration above 0", flag, v)
			}
			continue
		}
		rest = append(rest, a)
	}
	return d, rest, nil
}

// supervisorLink is the file of --supervisor-fd, nil when not given.
func supervisorLink(fd int) *os.File {
	if fd < 0 {
		return nil
	}
	return os.NewFile(uintptr(fd), "supervisor-link")
}

// takeHiddenFlag removes the boolean flag from args and says whether it
// was there.
func takeHiddenFlag(args []string, flag string) (bool, []string) {
	found := false
	rest := make([]string, 0, len(args))
	for _, a := range args {
		if a == flag {
			found = true
			continue
		}
		rest = append(rest, a)
	}
	return found, rest
}

func validate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("validate [-c] FILE",
		"Parses and checks a config, resolves every endpoint name and compiles every\n"+
			"route, loads every TLS certificate, key and session-ticket keys file,\n"+
			"exactly as serve would, without binding a socket. Exits 0 when the\n"+
			"config can be served, 1 with every problem found otherwise. With no file,\n"+
			"checks the embedded default config.", stderr)
	cfgPath := fs.String("c", "", "config `file` (TOML); empty: the embedded default")
	fs.StringVar(cfgPath, "config", "", "same as -c")
	// The file may also be the one argument: `validate FILE`, as with
	// nginx -t or haproxy -c, is what people type first.
	args, file := splitTrailingFile(args)
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	if file != "" {
		if *cfgPath != "" {
			fmt.Fprintf(stderr, "hotproxy validate: two configs given, -c %s and %s (give one)\n", *cfgPath, file)
			return exitUsage
		}
		*cfgPath = file
	}
	cfg, err := config.Load(*cfgPath)
	if err == nil {
		// serve's own build, stopped before it binds anything.
		var prep *server.Prepared
		prep, err = server.Prepare(cfg, workers.Identity{Version: version.Version})
		prep.Close()
	}
	if err != nil {
		fmt.Fprintf(stderr, "hotproxy validate: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: OK (%d listeners, %d clusters, concurrency %d)\n",
		cfg.Source, len(cfg.Listeners), len(cfg.Clusters), workers.Concurrency(cfg))
	return 0
}

// splitTrailingFile takes a last argument that is not a flag, nor the
// value of the flag before it, off args.
func splitTrailingFile(args []string) (rest []string, file string) {
	n := len(args)
	if n == 0 || strings.HasPrefix(args[n-1], "-") {
		return args, ""
	}
	if n >= 2 {
		prev := args[n-2]
		if prev == "-c" || prev == "--c" || prev == "-config" || prev == "--config" {
			return args, ""
		}
	}
	return args[:n-1], args[n-1]
}

func printVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("version", "Prints the build version and the versions of the interfaces\nbetween builds.", stderr)
	if rc := parse(fs, args); rc >= 0 {
		return rc
	}
	fmt.Fprintf(stdout, "hotproxy %s\nhot-restart protocol %s\nstats region layout %d.%d\n%s %s/%s\n",
		version.Version, hotrestart.ProtocolVersion, shm.LayoutMajor, shm.LayoutMinor, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}

// readyReporter tells whoever started this generation (the supervisor)
// whether it serves, through an inherited file descriptor: one line, then
// the descriptor is closed, so a reader sees EOF if the process dies first.
type readyReporter struct{ f *os.File }

func newReadyReporter(fd int) *readyReporter {
	if fd < 0 {
		return &readyReporter{}
	}
	return &readyReporter{f: os.NewFile(uintptr(fd), "ready-fd")}
}

func (r *readyReporter) ready() { r.say(fmt.Sprintf("READY %d\n", os.Getpid())) }

func (r *readyReporter) failed(err error) {
	r.say("FAILED " + strings.ReplaceAll(err.Error(), "\n", "; ") + "\n")
}

func (r *readyReporter) say(line string) {
	if r.f == nil {
		return
	}
	r.f.WriteString(line)
	r.close()
}

func (r *readyReporter) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}
